//! Toxiproxy's HTTP API as JSON, in serde types: what racecert's server answers and its client
//! reads (and what any Toxiproxy sends). The toxic kinds and their attributes are the engine's
//! own ([`noxious::toxic::ToxicKind`]); these types add the API's framing around them.

use noxious::toxic::{StreamDirection, Toxic, ToxicKind};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A proxy as the API shows it (`GET /proxies/{name}`, and each entry of `GET /proxies`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProxyInfo {
    /// Proxy name.
    pub name: String,
    /// Listen address.
    pub listen: String,
    /// Upstream address.
    pub upstream: String,
    /// Whether it accepts connections.
    pub enabled: bool,
    /// Installed toxics, upstream ones first.
    #[serde(default)]
    pub toxics: Vec<ToxicInfo>,
}

/// A toxic as the API shows it: `{name, type, stream, toxicity, attributes}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToxicInfo {
    /// Toxic name.
    pub name: String,
    /// Toxic type (`latency`, `timeout`, ...).
    #[serde(rename = "type")]
    pub kind: String,
    /// Direction: `upstream` or `downstream`.
    pub stream: String,
    /// Probability it applies to a connection.
    pub toxicity: f32,
    /// Type-specific attributes.
    #[serde(default)]
    pub attributes: Map<String, Value>,
}

impl ToxicInfo {
    /// The API view of an engine toxic.
    pub fn of(toxic: &Toxic) -> ToxicInfo {
        // The engine's kind serialises as `{"type": .., "attributes": {..}}`: take both apart.
        let (kind, attributes) = match serde_json::to_value(toxic.kind) {
            Ok(Value::Object(mut tagged)) => (
                tagged
                    .remove("type")
                    .and_then(|t| t.as_str().map(str::to_owned))
                    .unwrap_or_default(),
                match tagged.remove("attributes") {
                    Some(Value::Object(attributes)) => attributes,
                    _ => Map::new(),
                },
            ),
            _ => (toxic.kind.get_name().to_owned(), Map::new()),
        };
        ToxicInfo {
            name: toxic.name.clone(),
            kind,
            stream: toxic.direction.to_string(),
            toxicity: toxic.toxicity,
            attributes,
        }
    }

    /// An attribute as an unsigned integer, if it is one.
    pub fn attribute(&self, key: &str) -> Option<u64> {
        self.attributes.get(key).and_then(Value::as_u64)
    }
}

/// `POST /proxies`, and each entry of `POST /populate`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NewProxy {
    /// Proxy name (required).
    #[serde(default)]
    pub name: String,
    /// Listen address; empty or port 0: a free loopback port.
    #[serde(default)]
    pub listen: String,
    /// Upstream address (required).
    #[serde(default)]
    pub upstream: String,
    /// Whether it starts enabled (default true).
    #[serde(default = "enabled_by_default")]
    pub enabled: bool,
}

fn enabled_by_default() -> bool {
    true
}

/// `POST /proxies/{name}`: what is given changes, the rest stays.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProxyUpdate {
    /// New listen address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// New upstream address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    /// Enable or disable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// `POST /proxies/{name}/toxics`, with Toxiproxy's defaults: downstream, toxicity 1, name
/// `{type}_{stream}`, attributes left out are 0.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NewToxic {
    /// Toxic name (default `{type}_{stream}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Toxic type (required).
    #[serde(rename = "type", default)]
    pub kind: String,
    /// Direction (default downstream).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<StreamDirection>,
    /// Probability (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toxicity: Option<f32>,
    /// Type-specific attributes.
    #[serde(default)]
    pub attributes: Map<String, Value>,
}

/// `POST /proxies/{name}/toxics/{toxic}`: given attributes are merged into the current ones and
/// toxicity replaced if given; name, type and stream stay, as in Toxiproxy.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ToxicUpdate {
    /// New probability.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toxicity: Option<f32>,
    /// Attributes to change.
    #[serde(default)]
    pub attributes: Map<String, Value>,
}

/// The engine kind of toxic type `kind` with `attributes` (left-out attributes are 0). Errors
/// are messages for a 400 answer.
pub fn toxic_kind(kind: &str, attributes: &Map<String, Value>) -> Result<ToxicKind, String> {
    let tagged = if kind == "noop" {
        serde_json::json!({ "type": kind })
    } else {
        serde_json::json!({ "type": kind, "attributes": attributes })
    };
    serde_json::from_value(tagged).map_err(|err| {
        if err.to_string().starts_with("unknown variant") {
            format!("unsupported toxic type {kind}")
        } else {
            format!("bad request body: {kind} attributes: {err}")
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_toxics_read_as_toxiproxy_writes_them() {
        let toxic = Toxic {
            kind: ToxicKind::Latency {
                latency: 300,
                jitter: 0,
            },
            name: "latency_downstream".into(),
            toxicity: 1.0,
            direction: StreamDirection::Downstream,
        };
        let info = ToxicInfo::of(&toxic);
        let json = serde_json::to_value(&info).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"name": "latency_downstream", "type": "latency",
                "stream": "downstream", "toxicity": 1.0,
                "attributes": {"latency": 300, "jitter": 0}})
        );
        assert_eq!(info.attribute("latency"), Some(300));
        // Left-out attributes are 0; unknown types and wrong types are refused.
        let partial =
            serde_json::from_value::<Map<String, Value>>(serde_json::json!({"latency": 5}))
                .unwrap();
        assert_eq!(
            toxic_kind("latency", &partial),
            Ok(ToxicKind::Latency {
                latency: 5,
                jitter: 0
            })
        );
        assert_eq!(toxic_kind("noop", &Map::new()), Ok(ToxicKind::Noop));
        assert!(
            toxic_kind("bogus", &Map::new())
                .unwrap_err()
                .contains("unsupported")
        );
        let negative =
            serde_json::from_value::<Map<String, Value>>(serde_json::json!({"timeout": -1}))
                .unwrap();
        assert!(toxic_kind("timeout", &negative).is_err());
    }
}
