//! Requests submitted at seeded times over the first part of a free-running case (chaos and
//! fleet runners), so that faults meet work in flight.

use crate::Result;
use crate::history::SubmittedRequest;
use crate::reference::submit::{Api, InferenceRequest, normalize_input};
use rand::RngExt;
use rand::rngs::StdRng;
use std::time::Duration;

/// The arrival plan of a free-running case.
pub(crate) struct Arrivals {
    due: std::iter::Peekable<std::vec::IntoIter<(Duration, usize)>>,
    inputs: usize,
    /// What was submitted so far.
    pub(crate) submitted: Vec<SubmittedRequest>,
}

impl Arrivals {
    /// `count` requests at times drawn from `rng` within `window`, over `inputs` distinct inputs.
    pub(crate) fn new(count: usize, inputs: usize, window: Duration, rng: &mut StdRng) -> Arrivals {
        let mut due: Vec<(Duration, usize)> = (0..count)
            .map(|i| (window.mul_f64(rng.random_range(0.0..1.0)), i))
            .collect();
        due.sort();
        Arrivals {
            due: due.into_iter().peekable(),
            inputs: inputs.max(1),
            submitted: Vec::new(),
        }
    }

    /// Whether requests are still to come.
    pub(crate) fn pending(&mut self) -> bool {
        self.due.peek().is_some()
    }

    /// Submits every request due at `elapsed`; returns the idempotency keys submitted now.
    pub(crate) async fn submit_due(
        &mut self,
        elapsed: Duration,
        api: &mut Api,
    ) -> Result<Vec<String>> {
        let mut fresh = Vec::new();
        while let Some((at, i)) = self.due.peek().copied() {
            if elapsed < at {
                break;
            }
            self.due.next();
            let request_id = format!("req-{i}");
            let input = format!("input-{}", i % self.inputs);
            let submitted = api
                .submit(&InferenceRequest {
                    request_id: request_id.clone(),
                    input: input.clone(),
                })
                .await?;
            fresh.push(submitted.idempotency_key.clone());
            self.submitted.push(SubmittedRequest {
                request_id,
                idempotency_key: submitted.idempotency_key,
                input: normalize_input(&input),
            });
        }
        Ok(fresh)
    }
}
