//! Reading the queue stream's replies (entries, groups, pending entries) as the case needs them.

pub(super) fn text_of(value: &redis::Value) -> Option<String> {
    match value {
        redis::Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        redis::Value::SimpleString(s) => Some(s.clone()),
        redis::Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

pub(super) fn first_id(entries: &redis::Value) -> Option<String> {
    match entries {
        redis::Value::Array(items) => match items.first()? {
            redis::Value::Array(entry) => text_of(entry.first()?),
            _ => None,
        },
        _ => None,
    }
}

pub(super) fn stream_id(id: &str) -> (u64, u64) {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
}

pub(super) fn pairs(value: &redis::Value) -> Vec<(String, &redis::Value)> {
    match value {
        redis::Value::Array(items) => items
            .chunks(2)
            .filter_map(|pair| Some((text_of(pair.first()?)?, pair.get(1)?)))
            .collect(),
        redis::Value::Map(items) => items
            .iter()
            .filter_map(|(k, v)| Some((text_of(k)?, v)))
            .collect(),
        _ => Vec::new(),
    }
}

pub(super) fn group_field(groups: &redis::Value, group: &str, field: &str) -> Option<String> {
    let redis::Value::Array(groups) = groups else {
        return None;
    };
    groups.iter().find_map(|info| {
        let fields = pairs(info);
        let name = fields
            .iter()
            .find(|(k, _)| k == "name")
            .and_then(|(_, v)| text_of(v))?;
        (name == group)
            .then(|| {
                fields
                    .iter()
                    .find(|(k, _)| k == field)
                    .and_then(|(_, v)| text_of(v))
            })
            .flatten()
    })
}

pub(super) fn entry_of(entries: &redis::Value, key: &str) -> Option<String> {
    let redis::Value::Array(entries) = entries else {
        return None;
    };
    entries.iter().find_map(|entry| {
        let redis::Value::Array(parts) = entry else {
            return None;
        };
        let id = text_of(parts.first()?)?;
        let fields = pairs(parts.get(1)?);
        fields
            .iter()
            .any(|(k, v)| k == "idempotency_key" && text_of(v).as_deref() == Some(key))
            .then_some(id)
    })
}

pub(super) fn pending_owner(pending: &redis::Value, id: &str) -> Option<String> {
    let redis::Value::Array(entries) = pending else {
        return None;
    };
    entries.iter().find_map(|entry| {
        let redis::Value::Array(parts) = entry else {
            return None;
        };
        (text_of(parts.first()?)?.as_str() == id).then(|| text_of(parts.get(1)?))?
    })
}
