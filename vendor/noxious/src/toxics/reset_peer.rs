//! racecert patch: the `reset_peer` toxic, which upstream noxious lacks.
use bytes::Bytes;
use futures::{Sink, Stream, StreamExt};
use std::io;
use tokio::pin;
use tokio::time::{sleep, Duration};

/// Waits for the first chunk in its direction, discards it, waits `timeout` milliseconds and fails
/// the link, which closes it. As in Toxiproxy, the link's sockets are set to linger 0 while the
/// proxy holds a `reset_peer` toxic (see `proxy::create_links`), so that close is a TCP RST the
/// peer sees as "connection reset by peer". A link that closes before any data passes is not reset.
pub async fn run_reset_peer(
    input: impl Stream<Item = Bytes>,
    _output: impl Sink<Bytes>,
    timeout: u64, // in millis
) -> io::Result<()> {
    pin!(input);
    if input.next().await.is_none() {
        return Ok(());
    }
    sleep(Duration::from_millis(timeout)).await;
    Err(io::Error::new(
        io::ErrorKind::ConnectionReset,
        format!("reset_peer after {}ms", timeout),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::channel::mpsc;
    use futures::SinkExt;

    #[tokio::test]
    async fn resets_after_the_first_chunk_and_forwards_nothing() {
        let (mut in_tx, in_rx) = mpsc::channel::<Bytes>(4);
        let (out_tx, mut out_rx) = mpsc::channel::<Bytes>(4);
        in_tx.send(Bytes::from_static(b"GET")).await.unwrap();
        let err = run_reset_peer(in_rx, out_tx, 0).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset);
        assert_eq!(out_rx.next().await, None);
    }

    #[tokio::test]
    async fn a_link_closed_before_any_data_is_not_reset() {
        let (in_tx, in_rx) = mpsc::channel::<Bytes>(4);
        let (out_tx, _out_rx) = mpsc::channel::<Bytes>(4);
        drop(in_tx);
        assert!(run_reset_peer(in_rx, out_tx, 0).await.is_ok());
    }
}
