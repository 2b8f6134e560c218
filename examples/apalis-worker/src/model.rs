//! The model API as the team calls it: KServe v2 (Open Inference Protocol) over HTTP.

use std::time::Duration;

use serde::Deserialize;
use serde_json::json;

/// A KServe v2 client bound to one model server and one model name.
#[derive(Debug)]
pub struct Model {
    client: reqwest::Client,
    endpoint: String,
}

#[derive(Deserialize)]
struct InferResponse {
    outputs: Vec<Tensor>,
}

#[derive(Deserialize)]
struct Tensor {
    data: Vec<serde_json::Value>,
}

impl Model {
    /// `base` is the server (`MODEL_URL`), `name` the model in `/v2/models/{name}/infer`.
    pub fn new(base: &str, name: &str, timeout: Duration) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder().timeout(timeout).build()?;
        let endpoint = format!("{}/v2/models/{name}/infer", base.trim_end_matches('/'));
        Ok(Self { client, endpoint })
    }

    /// The URL every call goes to (logged as `backend_endpoint`).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// One BYTES tensor in, the first element of the first output tensor back.
    pub async fn infer(
        &self,
        input: &str,
    ) -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
        let body = json!({
            "inputs": [{"name": "input", "shape": [1], "datatype": "BYTES", "data": [input]}]
        });
        let answer: InferResponse = self
            .client
            .post(&self.endpoint)
            .json(&body)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        match answer.outputs.first().and_then(|t| t.data.first()) {
            Some(serde_json::Value::String(text)) => Ok(text.clone()),
            Some(other) => Ok(other.to_string()),
            None => Err("answer has no outputs[0].data[0]".into()),
        }
    }
}
