//! The job queue: a Redis Stream read through a consumer group. A delivery not acknowledged within
//! the visibility timeout is redelivered to whichever worker asks next (XAUTOCLAIM); how many
//! times it was delivered is its `queue_receive_count`. The controller can force a redelivery at
//! any step by claiming with a zero idle time: that is how a schedule makes the visibility
//! timeout expire without sleeping.

use crate::contract::delivery::{Delivery, JobMessage};
use crate::contract::{CONSUMER_GROUP, Keys};
use crate::{Error, Result};
use redis::AsyncCommands;
use redis::aio::ConnectionManager;
use redis::streams::{
    StreamAutoClaimOptions, StreamAutoClaimReply, StreamId, StreamPendingCountReply,
    StreamReadOptions, StreamReadReply,
};
use std::time::Duration;

/// The queue of one namespace.
#[derive(Clone)]
pub struct Queue {
    redis: ConnectionManager,
    stream: String,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue")
            .field("stream", &self.stream)
            .finish()
    }
}

impl Queue {
    /// The queue under `keys`, creating the stream and consumer group if needed.
    pub async fn open(redis: ConnectionManager, keys: &Keys) -> Result<Queue> {
        let mut queue = Queue {
            redis,
            stream: keys.stream(),
        };
        queue.ensure_group().await?;
        Ok(queue)
    }

    /// The queue under `keys` over `redis`, for a stream whose group exists already (no round
    /// trip).
    pub fn over(redis: ConnectionManager, keys: &Keys) -> Queue {
        Queue {
            redis,
            stream: keys.stream(),
        }
    }

    /// The stream key.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// Creates the consumer group (and stream) unless it exists. Called again after a Redis
    /// restart wiped both.
    pub async fn ensure_group(&mut self) -> Result<()> {
        let created: redis::RedisResult<()> = self
            .redis
            .xgroup_create_mkstream(&self.stream, CONSUMER_GROUP, "0")
            .await;
        match created {
            Ok(()) => Ok(()),
            Err(err) if err.code() == Some("BUSYGROUP") => Ok(()),
            Err(err) => Err(err.into()),
        }
    }

    /// Enqueues a job; returns its entry id.
    pub async fn enqueue(&mut self, job: &JobMessage) -> Result<String> {
        let id: String = self
            .redis
            .xadd(
                &self.stream,
                "*",
                &[
                    ("idempotency_key", job.idempotency_key.as_str()),
                    ("job_id", job.job_id.as_str()),
                    ("request_id", job.request_id.as_str()),
                    ("input", job.input.as_str()),
                ],
            )
            .await?;
        Ok(id)
    }

    /// Next delivery for `consumer`: first an entry whose visibility timeout expired (idle for at
    /// least `visibility_timeout`), else a new one. `None` when there is nothing to do.
    pub async fn receive(
        &mut self,
        consumer: &str,
        visibility_timeout: Duration,
    ) -> Result<Option<Delivery>> {
        if let Some(delivery) = self.claim_stale(consumer, visibility_timeout).await? {
            return Ok(Some(delivery));
        }
        self.read_new(consumer).await
    }

    /// The next entry never delivered to the group, for `consumer`; `None` when there is none.
    pub async fn read_new(&mut self, consumer: &str) -> Result<Option<Delivery>> {
        let options = StreamReadOptions::default()
            .group(CONSUMER_GROUP, consumer)
            .count(1);
        let reply: Option<StreamReadReply> = match self
            .redis
            .xread_options(&[&self.stream], &[">"], &options)
            .await
        {
            Ok(reply) => reply,
            Err(err) => return self.after_read_error(err).await,
        };
        let entry = reply
            .and_then(|r| r.keys.into_iter().next())
            .and_then(|k| k.ids.into_iter().next());
        match entry {
            Some(entry) => Ok(Some(parse(entry, 1)?)),
            None => Ok(None),
        }
    }

    /// Claims for `consumer` one delivered-but-unacknowledged entry idle for at least `min_idle`
    /// (zero: any, which is how a schedule forces a redelivery).
    pub async fn claim_stale(
        &mut self,
        consumer: &str,
        min_idle: Duration,
    ) -> Result<Option<Delivery>> {
        let reply: StreamAutoClaimReply = match self
            .redis
            .xautoclaim_options(
                &self.stream,
                CONSUMER_GROUP,
                consumer,
                min_idle.as_millis() as u64,
                "0-0",
                StreamAutoClaimOptions::default().count(1),
            )
            .await
        {
            Ok(reply) => reply,
            Err(err) => return self.after_read_error(err).await,
        };
        let Some(entry) = reply.claimed.into_iter().next() else {
            return Ok(None);
        };
        // XAUTOCLAIM does not return the delivery count; XPENDING does (it includes this claim).
        let pending: StreamPendingCountReply = self
            .redis
            .xpending_count(&self.stream, CONSUMER_GROUP, &entry.id, &entry.id, 1)
            .await?;
        let count = pending
            .ids
            .first()
            .map(|p| p.times_delivered as u64)
            .unwrap_or(1);
        Ok(Some(parse(entry, count)?))
    }

    /// A read failed. If the group vanished with a Redis restart, recreate it (its entries are
    /// gone anyway) and report nothing to deliver; any other error is returned.
    async fn after_read_error(&mut self, err: redis::RedisError) -> Result<Option<Delivery>> {
        if err.code() == Some("NOGROUP") {
            self.ensure_group().await?;
            return Ok(None);
        }
        Err(err.into())
    }

    /// Acknowledges a delivery: it will not be redelivered. Returns whether it was still pending.
    pub async fn ack(&mut self, entry_id: &str) -> Result<bool> {
        let acked: u64 = self
            .redis
            .xack(&self.stream, CONSUMER_GROUP, &[entry_id])
            .await?;
        Ok(acked == 1)
    }

    /// How many deliveries a receive could still make: entries delivered and not acknowledged
    /// plus entries never delivered (one `XINFO GROUPS` round trip). `None` when the server
    /// cannot tell (no group, or a lag it does not know).
    pub async fn backlog(&mut self) -> Result<Option<u64>> {
        let groups: redis::streams::StreamInfoGroupsReply =
            match self.redis.xinfo_groups(&self.stream).await {
                Ok(groups) => groups,
                // The server refused (no such stream, after a restart): it cannot tell.
                Err(err) if err.code().is_some() => return Ok(None),
                Err(err) => return Err(err.into()),
            };
        Ok(groups
            .groups
            .iter()
            .find(|g| g.name == CONSUMER_GROUP)
            .and_then(|g| Some(g.pending as u64 + g.lag? as u64)))
    }

    /// Every entry delivered and not acknowledged: its job's idempotency key and how many times
    /// it has been delivered (one `XPENDING` and one `XRANGE` round trip).
    pub async fn pending(&mut self) -> Result<Vec<(String, u64)>> {
        let pending: StreamPendingCountReply = match self
            .redis
            .xpending_count(&self.stream, CONSUMER_GROUP, "-", "+", 1000)
            .await
        {
            Ok(pending) => pending,
            // No stream or group (a Redis restart took them): nothing is pending.
            Err(err) if err.code().is_some() => return Ok(Vec::new()),
            Err(err) => return Err(err.into()),
        };
        if pending.ids.is_empty() {
            return Ok(Vec::new());
        }
        let entries: redis::streams::StreamRangeReply = self.redis.xrange_all(&self.stream).await?;
        Ok(pending
            .ids
            .iter()
            .filter_map(|p| {
                let entry = entries.ids.iter().find(|e| e.id == p.id)?;
                let key = entry.get::<String>("idempotency_key")?;
                Some((key, p.times_delivered as u64))
            })
            .collect())
    }

    /// Entries delivered but not acknowledged.
    pub async fn pending_count(&mut self) -> Result<u64> {
        let reply: redis::Value = redis::cmd("XPENDING")
            .arg(&self.stream)
            .arg(CONSUMER_GROUP)
            .query_async(&mut self.redis)
            .await?;
        match reply {
            redis::Value::Array(items) => Ok(items
                .first()
                .and_then(|v| redis::from_redis_value_ref::<u64>(v).ok())
                .unwrap_or(0)),
            _ => Ok(0),
        }
    }
}

fn parse(entry: StreamId, receive_count: u64) -> Result<Delivery> {
    let field = |name: &str| -> Result<String> {
        entry.get::<String>(name).ok_or_else(|| {
            Error::other(format!(
                "stream entry {} has no {name} field: not a job message",
                entry.id
            ))
        })
    };
    Ok(Delivery {
        job: JobMessage {
            idempotency_key: field("idempotency_key")?,
            job_id: field("job_id")?,
            request_id: field("request_id")?,
            input: field("input")?,
        },
        entry_id: entry.id.clone(),
        receive_count,
    })
}
