//! How a case's request enters the team's system: the framework's own message written by
//! racecert (a preset), or the team's submit command run with the submitter's links, and the
//! message that command pushed read back from the wire (the framework's id for the request, the
//! delivery tag a restore fault ages).

use super::case::{CaseCtx, SUBMIT_BOUND};
use super::{SUBMITTER, now_ms};
use crate::history::Observation;
use crate::system::preset::{APALIS_INSERT, celery_message, dramatiq_keys, dramatiq_message};
use crate::system::{Framework, Submit, fill};
use crate::{Error, Result};
use rand::RngExt;
use std::collections::BTreeMap;

impl CaseCtx<'_, '_> {
    /// Submits one request the way the framework's clients do; the Celery preset returns the
    /// delivery tag it wrote.
    pub(super) async fn submit(&mut self, request_id: &str, input: &str) -> Result<Option<String>> {
        let system = self.system;
        let venv = self.venv.clone();
        let venv = venv.as_str();
        let values = [("request_id", request_id), ("input", input), ("venv", venv)];
        self.observations.push((
            now_ms(),
            Observation::Submitted {
                key: request_id.to_owned(),
            },
        ));
        match &system.submit {
            Submit::Preset { task, args, queue } => {
                let args: BTreeMap<String, String> = args
                    .iter()
                    .map(|(k, v)| (k.clone(), fill(v, &values)))
                    .collect();
                match system.framework {
                    Framework::Celery => {
                        let tag = self.submit_celery(task, queue, &args, request_id).await?;
                        Ok(Some(tag))
                    }
                    Framework::Apalis => {
                        self.submit_apalis(task, &args).await?;
                        Ok(None)
                    }
                    Framework::Dramatiq => {
                        self.submit_dramatiq(task, queue, &args, request_id).await?;
                        Ok(None)
                    }
                    Framework::Custom => unreachable!("validated: custom has no preset"),
                }
            }
            Submit::Command(command) => self.submit_by_command(command, request_id, input).await,
        }
    }

    /// Pushes the request as Celery's message of `task` on `queue`; returns its delivery tag.
    async fn submit_celery(
        &mut self,
        task: &str,
        queue: &str,
        args: &BTreeMap<String, String>,
        request_id: &str,
    ) -> Result<String> {
        let rng = &mut self.rng;
        let message = celery_message(task, queue, args, &mut || rng.random::<u128>());
        let _: i64 = redis::cmd("LPUSH")
            .arg(queue)
            .arg(&message.envelope)
            .query_async(self.rd)
            .await?;
        self.enqueued(
            "racecert",
            request_id,
            &message.task_id,
            format!(
                "LPUSH {queue} {task}[{}] tag {}",
                message.task_id, message.delivery_tag
            ),
        );
        Ok(message.delivery_tag)
    }

    /// Inserts the request as an apalis job of type `task`.
    async fn submit_apalis(&mut self, task: &str, args: &BTreeMap<String, String>) -> Result<()> {
        let system = self.system;
        let job = serde_json::to_string(args).map_err(|e| Error::other(e.to_string()))?;
        let id: String = sqlx::query_scalar(APALIS_INSERT)
            .bind(task)
            .bind(&job)
            .fetch_one(&mut *self.pg)
            .await
            .map_err(|err| {
                Error::Config(format!(
                    "{}: enqueueing an apalis job failed (are apalis' tables created by the worker?): {err}",
                    system.place("submit")
                ))
            })?;
        self.note(
            "racecert",
            "db",
            format!("INSERT apalis.jobs {task} id {id}"),
            "message",
        );
        Ok(())
    }

    /// Enqueues the request as Dramatiq's message for actor `task` on `queue`.
    async fn submit_dramatiq(
        &mut self,
        task: &str,
        queue: &str,
        args: &BTreeMap<String, String>,
        request_id: &str,
    ) -> Result<()> {
        let namespace = &self.system.dramatiq()?.namespace;
        let rng = &mut self.rng;
        let message = dramatiq_message(task, queue, args, now_ms(), &mut || rng.random::<u128>());
        let (list, messages) = dramatiq_keys(namespace, queue);
        // dispatch.lua's `enqueue`, in one transaction as the script runs.
        let _: () = redis::pipe()
            .atomic()
            .hset(&messages, &message.redis_message_id, &message.data)
            .ignore()
            .rpush(&list, &message.redis_message_id)
            .ignore()
            .query_async(self.rd)
            .await?;
        self.enqueued(
            "racecert",
            request_id,
            &message.message_id,
            format!(
                "HSET {messages} + RPUSH {list}: {task}[{}]",
                message.message_id
            ),
        );
        Ok(())
    }

    /// Runs the team's submit command for the request; the delivery tag of the message it
    /// pushed, when the wire shows one.
    async fn submit_by_command(
        &mut self,
        command: &str,
        request_id: &str,
        input: &str,
    ) -> Result<Option<String>> {
        let since = now_ms();
        let command = self
            .team_command(
                command,
                &[("request_id", request_id), ("input", input)],
                "submit",
                "submit command",
                SUBMIT_BOUND,
            )
            .await?;
        self.note(
            "racecert",
            "racecert",
            format!("submitted with `{command}`"),
            "message",
        );
        let Some(pushed) = self.pushed_by_submitter(since, request_id, input) else {
            return Ok(None);
        };
        self.enqueued(
            SUBMITTER,
            request_id,
            &pushed.job_id,
            format!(
                "the submitter pushed message {}{} (read from the wire)",
                pushed.job_id,
                pushed
                    .delivery_tag
                    .as_ref()
                    .map(|tag| format!(", delivery tag {tag}"))
                    .unwrap_or_default()
            ),
        );
        Ok(pushed.delivery_tag)
    }

    /// Records that `from` enqueued the request as the framework's message `job_id`: on the
    /// diagram, and in the history that ties deliveries to requests.
    fn enqueued(&mut self, from: &str, request_id: &str, job_id: &str, shown: String) {
        self.note(from, "redis", shown, "message");
        self.observations.push((
            now_ms(),
            Observation::Enqueued {
                key: request_id.to_owned(),
                job_id: job_id.to_owned(),
            },
        ));
    }

    /// The message the submit command pushed for the request, read from its Redis link: the
    /// last push since `since` (Unix ms) whose message carries the request's id or input. A team
    /// API that enqueues through racecert's proxies thereby tells racecert its framework's id
    /// for the request (and, on Celery's transport, the delivery tag a restore fault ages).
    fn pushed_by_submitter(
        &self,
        since: i64,
        request_id: &str,
        input: &str,
    ) -> Option<crate::system::preset::Enqueued> {
        let wire = self.fleet.wire.lock().expect("poisoned");
        wire.iter()
            .rev()
            .filter(|(at, event)| {
                *at >= since && event.worker == SUBMITTER && event.service == "redis"
            })
            .filter_map(|(_, event)| match &event.trip.request {
                crate::wire::Request::Redis(command) => Some(
                    command
                        .pushed
                        .iter()
                        .filter_map(|value| crate::system::preset::read_enqueued(value)),
                ),
                _ => None,
            })
            .flatten()
            .find(|pushed| pushed.carries.contains(request_id) || pushed.carries.contains(input))
    }
}
