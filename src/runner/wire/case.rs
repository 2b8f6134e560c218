//! One wire case on a set of worker processes: requests submitted, steps run at the gates,
//! faults applied through [`crate::fault::apply`] (the case is the fault's plane), then a drain
//! that heals, lets every worker finish, and judges what concerns the case's requests. A worker
//! the schedule kills is replaced by a process started ahead on link sets of its own ([`Spare`]):
//! the kill costs the case no interpreter start.

mod stream;
use super::WireSettings;
use crate::check::CaseResult;
use crate::contract::log::Echo;
use crate::contract::worker::Infra;
use crate::contract::{CONSUMER_GROUP, Keys};
use crate::env::TestBed;
use crate::fault::{Effect, apply};
use crate::history::{Observation, Recorder, SubmittedRequest, read_jobs};
use crate::reference::Pipeline;
use crate::reference::process::WorkerEnv;
use crate::reference::submit::InferenceRequest;
use crate::runner::fleet::{Proc, Processes, signal, stop};
use crate::runner::link_gate::{Gate, Standby, uncounted};
use crate::runner::plane::{BackendControl, CasePlane, Services, WorkerLink};
use crate::schedule::search::{Divergence, Outcome};
use crate::schedule::{RequestSpec, Schedule, WireStep};
use crate::wire::WireEvent;
use crate::{Error, Result};
use nix::sys::signal::Signal;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stream::*;

/// How one release went.
pub(super) enum Released {
    /// Counted round trips finished (their fingerprints).
    Trips(Vec<String>),
    /// Only uncounted ones.
    Uncounted,
    /// Not answered in time: the worker waits on something (a lock).
    Blocked,
}

/// Why a worker is not runnable now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stuck {
    /// It did not come back to the gate.
    Away,
    /// It polls an empty queue.
    Idle,
}

/// Worker processes behind their gates, kept from case to case (a process costs its interpreter's
/// start; a case costs a few milliseconds of set-up): each case submits requests of its own,
/// judges only what concerns them, and leaves every worker held before its next queue poll.
pub(super) struct Case<'b> {
    settings: WireSettings,
    api: crate::reference::submit::Api,
    /// Cases begun on these processes.
    cases: u64,
    /// Where this case's events start in the recorder.
    events_from: usize,
    plane: CasePlane<'b, Processes>,
    gates: Vec<Arc<Gate>>,
    recorder: Arc<Recorder>,
    admin: Infra,
    keys: Keys,
    submitted: Vec<SubmittedRequest>,
    /// Per worker: started since it last came to the gate (waits `start`, not `arrive`).
    fresh: Vec<bool>,
    notes: Vec<String>,
    trace: Vec<Vec<String>>,
    steps_run: Vec<WireStep>,
    started: Instant,
    /// Jobs whose lease the drain found set to outlive the liveness bound (reported once).
    outliving: Vec<String>,
    /// Per worker: which of the services' link sets its live process uses.
    live: Vec<usize>,
    /// Per worker: a process started ahead to replace it when the schedule kills it (empty when
    /// the case's schedules kill no worker; `None` only while one takes its worker's place).
    spares: Vec<Option<Spare>>,
    /// This case's names in fingerprints (every gate's, a spare's too).
    aliases: Vec<(String, String)>,
}

/// A worker's replacement, started ahead on link sets of its own, behind a gate on standby: a
/// crash then costs the case no interpreter start (a Python worker's is about 200 ms).
struct Spare {
    /// Its link set (an index into the services' links).
    link: usize,
    gate: Arc<Gate>,
    standby: Arc<Standby>,
    proc: Proc,
}

/// Sends what passes `link` through `gate` (which holds it) to the recorder, attributed to
/// `worker` (while the gate's process is live).
fn attach(
    link: &WorkerLink,
    worker: &str,
    gate: &Arc<Gate>,
    recorder: &Arc<Recorder>,
) -> Result<()> {
    let listener = {
        let (record, gate) = (recorder.wire_listener(), gate.clone());
        Arc::new(move |event: WireEvent| {
            gate.trip(&event);
            if gate.is_live() {
                record(event);
            }
        })
    };
    link.links.record(worker, listener);
    if !link.links.hold(Some(gate.clone())) {
        return Err(Error::Config(
            "wire schedules need the proxy in process (a remote TOXIPROXY_URL cannot hold \
             round trips)"
                .into(),
        ));
    }
    Ok(())
}

static CASES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl<'b> Case<'b> {
    /// Starts the processes of `settings` behind their gates; with `spares`, a replacement per
    /// worker too, for schedules that kill workers.
    pub(super) async fn open(
        bed: &'b TestBed,
        settings: &WireSettings,
        spares: bool,
    ) -> Result<Case<'b>> {
        if settings.workers.is_empty() || settings.command.trim().is_empty() {
            return Err(Error::Config(
                "a wire schedule needs a worker command and workers".into(),
            ));
        }
        let started = Instant::now();
        let namespace = format!(
            "w{}c{}",
            std::process::id(),
            CASES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let keys = Keys::namespaced(&namespace);
        let recorder = Recorder::new();
        let mut links = Vec::new();
        let mut envs = Vec::new();
        let mut gates = Vec::new();
        let workers = settings.workers.len();
        // Link sets in worker order, then the spares' (link set `i` serves worker `i % workers`).
        let sets = if spares { 2 * workers } else { workers };
        for set in 0..sets {
            let spec = &settings.workers[set % workers];
            // A tapped proxy restarts on its port; under load another socket may take the port
            // meanwhile: new links (new ports) are tried before giving up.
            let mut tries = 0;
            let link = loop {
                match WorkerLink::open_with(bed, true, false, true).await {
                    Ok(link) => break link,
                    Err(err) if tries < 3 && err.to_string().contains("Address already in use") => {
                        tries += 1;
                        tracing::warn!(%err, "opening a worker's links again");
                    }
                    Err(err) => return Err(err),
                }
            };
            if set < workers {
                let gate = Gate::new(&spec.id, keys.prefix(), settings.max_hold);
                attach(&link, &spec.id, &gate, &recorder)?;
                gates.push(gate);
            }
            let mut by_version = BTreeMap::new();
            for (version, backend) in &link.backends {
                by_version.insert(
                    version.clone(),
                    WorkerEnv {
                        worker_id: String::new(),
                        model_version: version.clone(),
                        redis_url: link.links.redis_url().to_owned(),
                        database_url: link.links.database_url().to_owned(),
                        backend_url: backend.url.clone(),
                        backend_endpoint: backend.name.clone(),
                        key_prefix: keys.prefix().to_owned(),
                        lease_ttl: settings.lease_ttl,
                        visibility_timeout: settings.visibility_timeout,
                        backend_timeout: settings.backend_timeout,
                        defects: settings.defects.clone(),
                    },
                );
            }
            envs.push(by_version);
            links.push(link);
        }
        let admin =
            Infra::connect_harness(&bed.harness_redis_url(), &bed.harness_database_url()).await?;
        let api = Pipeline::with_infra(
            admin.clone(),
            keys.clone(),
            BTreeMap::new(),
            recorder.log_sink(Echo::Off),
        )
        .await?
        .api;
        let mut processes = Processes {
            command: settings.command.clone(),
            env: envs,
            recorder: recorder.clone(),
            outputs: Arc::default(),
            starts: 0,
            procs: Vec::new(),
            readers: Vec::new(),
            // Wire schedules never pause by the fleet's rule; the field is the fleet's.
            wake: rand::SeedableRng::seed_from_u64(0),
            // A killed worker's place goes to its spare (`Case::replace`).
            restart_crashed: false,
        };
        for (index, spec) in settings.workers.iter().enumerate() {
            let proc = processes.start(index, spec)?;
            processes.procs.push(proc);
        }
        // Every worker comes to the gate (its first effectful request) before the first step.
        let mut notes = Vec::new();
        for gate in &gates {
            if gate.arrival(settings.start, &mut notes).await.is_none() {
                // A command that cannot run as a worker gets an error with what it said, not a
                // verdict on jobs nobody worked on.
                if let Some(message) = processes.exited_at_once().await {
                    return Err(Error::Config(message));
                }
                notes.push(format!(
                    "{} sent no request within {} s of its start (see its stderr)",
                    gate.worker,
                    settings.start.as_secs()
                ));
            }
        }
        let services = Services::new(
            bed,
            keys.clone(),
            admin.clone(),
            links,
            BackendControl::Toxics,
            settings.defects.clone(),
            settings.backend_timeout,
        );
        let mut case = Case {
            settings: settings.clone(),
            api,
            cases: 0,
            events_from: 0,
            plane: CasePlane {
                services,
                workers: processes,
            },
            fresh: vec![false; gates.len()],
            gates,
            recorder,
            admin,
            keys,
            submitted: Vec::new(),
            notes,
            trace: Vec::new(),
            steps_run: Vec::new(),
            started,
            outliving: Vec::new(),
            live: (0..workers).collect(),
            spares: Vec::new(),
            aliases: Vec::new(),
        };
        // The spares start once the workers are at their gates: a command that cannot start
        // has said so by then, and the workers' starts did not wait on theirs.
        for index in (0..workers).filter(|_| spares) {
            let spare = case.stand_by(workers + index, index)?;
            case.spares.push(Some(spare));
        }
        Ok(case)
    }

    /// Starts a replacement for worker `index` on link set `link`, behind a gate on standby.
    fn stand_by(&mut self, link: usize, index: usize) -> Result<Spare> {
        let spec = self.settings.workers[index].clone();
        let standby = Standby::new();
        let gate = Gate::on_standby(
            &spec.id,
            self.keys.prefix(),
            self.settings.max_hold,
            standby.clone(),
        );
        gate.begin(self.aliases.clone());
        attach(
            &self.plane.services.links[link],
            &spec.id,
            &gate,
            &self.recorder,
        )?;
        let proc = self
            .plane
            .workers
            .launch(link, &spec, Some(standby.clone()))?;
        Ok(Spare {
            link,
            gate,
            standby,
            proc,
        })
    }

    /// Worker `index`'s process is gone (killed by the schedule, or it left): what it held at
    /// its gate never reaches a server, and its spare takes its place (live from now on, its
    /// start observed), while a new spare starts on the links it leaves. Without spares a new
    /// process starts in its place.
    fn replace(&mut self, index: usize) -> Result<()> {
        self.gates[index].abort_held();
        self.fresh[index] = true;
        let spec = self.settings.workers[index].clone();
        if self.spares.is_empty() {
            let proc = self.plane.workers.start(self.live[index], &spec)?;
            self.plane.workers.procs[index] = proc;
            return Ok(());
        }
        let mut spare = self.spares[index].take().expect("a spare per worker");
        if spare.proc.child.try_wait().ok().flatten().is_some() {
            // It died on standby (its command gave up waiting, say): one more start.
            spare.gate.abort_held();
            spare = self.stand_by(spare.link, index)?;
        }
        spare.gate.keep_newest();
        spare.standby.go_live();
        self.recorder.observe(Observation::WorkerStarted {
            worker: spec.id.clone(),
            version: spec.version.clone(),
        });
        let Spare {
            link, gate, proc, ..
        } = spare;
        // The dead process (already waited for) goes with its place.
        self.plane.workers.procs[index] = proc;
        self.gates[index] = gate;
        let left = std::mem::replace(&mut self.live[index], link);
        self.spares[index] = Some(self.stand_by(left, index)?);
        Ok(())
    }

    /// Starts a case: its requests (ids of this case's own, fingerprinted as `{req#i}`), a clean
    /// trace.
    pub(super) async fn begin(&mut self, requests: &[RequestSpec]) -> Result<()> {
        self.cases += 1;
        self.started = Instant::now();
        self.events_from = self.recorder.len();
        self.trace.clear();
        self.steps_run.clear();
        self.submitted.clear();
        self.outliving.clear();
        let mut aliases = Vec::new();
        for (i, request) in requests.iter().enumerate() {
            let request_id = format!("c{}-{}", self.cases, request.request_id);
            let done = self
                .api
                .submit(&InferenceRequest {
                    request_id: request_id.clone(),
                    input: request.input.clone(),
                })
                .await?;
            let bare = done
                .idempotency_key
                .strip_prefix(self.keys.prefix())
                .unwrap_or(&done.idempotency_key)
                .to_owned();
            aliases.push((bare, format!("{{req#{i}}}")));
            self.submitted.push(SubmittedRequest {
                request_id,
                idempotency_key: done.idempotency_key,
                input: crate::reference::submit::normalize_input(&request.input),
            });
        }
        let spares = self.spares.iter().flatten().map(|spare| &spare.gate);
        for gate in self.gates.iter().chain(spares) {
            gate.begin(aliases.clone());
        }
        self.aliases = aliases;
        self.plane.services.requests = self
            .submitted
            .iter()
            .map(|r| r.idempotency_key.clone())
            .collect();
        Ok(())
    }

    /// How many workers the case has.
    pub(super) fn workers(&self) -> usize {
        self.gates.len()
    }

    /// Records a step a generator took as it went (PCT decides release by release; its steps
    /// are the releases grouped afterwards).
    pub(super) fn record_generated(&mut self, step: WireStep, prints: Vec<String>) {
        let number = self.steps_run.len() + 1;
        self.recorder.step(number, step.to_string());
        self.steps_run.push(step);
        self.trace.push(prints);
    }

    fn worker(&self, worker: usize) -> usize {
        worker % self.gates.len()
    }

    /// Whether the queue has something for a poll: an entry never delivered, or a delivery idle
    /// past the visibility timeout.
    async fn work_available(&self) -> Result<bool> {
        let mut redis = self.admin.redis.clone();
        let stream = self.keys.stream();
        let last: redis::Value = redis::cmd("XREVRANGE")
            .arg(&stream)
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1)
            .query_async(&mut redis)
            .await?;
        let last_id = first_id(&last);
        let groups: redis::Value = redis::cmd("XINFO")
            .arg("GROUPS")
            .arg(&stream)
            .query_async(&mut redis)
            .await
            .unwrap_or(redis::Value::Nil);
        let delivered = group_field(&groups, CONSUMER_GROUP, "last-delivered-id");
        if let (Some(last), Some(delivered)) = (last_id, delivered)
            && stream_id(&last) > stream_id(&delivered)
        {
            return Ok(true);
        }
        let idle: redis::Value = redis::cmd("XPENDING")
            .arg(&stream)
            .arg(CONSUMER_GROUP)
            .arg("IDLE")
            .arg(self.settings.visibility_timeout.as_millis() as u64)
            .arg("-")
            .arg("+")
            .arg(1)
            .query_async(&mut redis)
            .await
            .unwrap_or(redis::Value::Nil);
        Ok(matches!(&idle, redis::Value::Array(items) if !items.is_empty()))
    }

    /// The worker's next held request, if it is runnable now. A worker released last came back
    /// already (or was given `arrive` to), so only a fresh process is waited for.
    pub(super) async fn runnable(
        &mut self,
        worker: usize,
    ) -> Result<std::result::Result<String, Stuck>> {
        let wait = if self.fresh[worker] {
            self.settings.start
        } else {
            Duration::ZERO
        };
        let mut notes = Vec::new();
        let front = self.gates[worker].arrival(wait, &mut notes).await;
        self.notes.extend(notes);
        let Some((fingerprint, poll)) = front else {
            return Ok(Err(Stuck::Away));
        };
        self.fresh[worker] = false;
        if poll && !self.work_available().await? {
            return Ok(Err(Stuck::Idle));
        }
        Ok(Ok(fingerprint))
    }

    pub(super) async fn release(&mut self, worker: usize) -> Released {
        let gate = self.gates[worker].clone();
        match gate.release(self.settings.answer).await {
            None => {
                self.notes.push(format!(
                    "{} blocked: a released request was not answered within {} ms",
                    gate.worker,
                    self.settings.answer.as_millis()
                ));
                Released::Blocked
            }
            Some(trips) => {
                // Let it come back with its next request, so every decision sees each worker
                // either at the gate or away (blocked, busy).
                let mut notes = Vec::new();
                gate.arrival(self.settings.arrive, &mut notes).await;
                self.notes.extend(notes);
                let prints: Vec<String> = trips
                    .iter()
                    .filter(|trip| !uncounted(trip))
                    .map(|trip| gate.print(&trip.request))
                    .collect();
                if prints.is_empty() {
                    Released::Uncounted
                } else {
                    Released::Trips(prints)
                }
            }
        }
    }

    /// Runs `worker` for up to `trips` counted round trips, or until it holds before `before`;
    /// the fingerprints of what it completed.
    async fn run_worker(
        &mut self,
        worker: usize,
        trips: u32,
        before: Option<&str>,
    ) -> Result<Vec<String>> {
        let worker = self.worker(worker);
        let mut done = Vec::new();
        let mut counted = 0;
        // Uncounted releases are bounded too: a worker that only ever polls stops somewhere.
        let mut releases = 0;
        while counted < trips && releases < 400 {
            let fingerprint = match self.runnable(worker).await? {
                Ok(fingerprint) => fingerprint,
                Err(_) => break,
            };
            if before.is_some_and(|b| fingerprint.contains(b)) {
                break;
            }
            releases += 1;
            match self.release(worker).await {
                Released::Trips(prints) => {
                    counted += 1;
                    done.extend(prints);
                }
                Released::Uncounted => {}
                Released::Blocked => break,
            }
        }
        Ok(done)
    }

    pub(super) async fn step(&mut self, step: &WireStep) -> Result<Vec<String>> {
        let started = Instant::now();
        let trips = self.run_step(step).await;
        // Where a case's time goes (`RUST_LOG=racecert::runner::wire=debug`).
        tracing::debug!(%step, elapsed_us = started.elapsed().as_micros() as u64, "wire step");
        trips
    }

    async fn run_step(&mut self, step: &WireStep) -> Result<Vec<String>> {
        let number = self.steps_run.len() + 1;
        self.recorder.step(number, step.to_string());
        self.steps_run.push(step.clone());
        let trips = match step {
            WireStep::Run { worker, trips } => self.run_worker(*worker, *trips, None).await?,
            WireStep::Until { worker, before } => {
                self.run_worker(*worker, u32::MAX, Some(before)).await?
            }
            WireStep::Finish { worker } => self.run_worker(*worker, 200, None).await?,
            WireStep::Fault(fault) => {
                let effect = apply(fault, &mut self.plane).await?;
                // What the fault did decides what follows on processes.
                if let Effect::LeaseExpired { key, .. } = &effect {
                    // A pause longer than the lease is longer than the visibility timeout too:
                    // the delivery is claimable by the next poll.
                    self.expire_delivery(key).await?;
                }
                if let Effect::WorkerCrashed { worker, .. } = &effect
                    && let Some(index) = self.settings.workers.iter().position(|w| w.id == *worker)
                {
                    // Its replacement comes to the gate before the schedule goes on.
                    self.replace(index)?;
                    let _ = self.runnable(index).await?;
                }
                self.recorder.fault(effect);
                Vec::new()
            }
        };
        self.trace.push(trips.clone());
        Ok(trips)
    }

    /// Makes the delivery of `key` idle past the visibility timeout (its owner unchanged): the
    /// next poll of any worker claims it.
    async fn expire_delivery(&self, key: &str) -> Result<bool> {
        let mut redis = self.admin.redis.clone();
        let stream = self.keys.stream();
        let pending: redis::Value = redis::cmd("XPENDING")
            .arg(&stream)
            .arg(CONSUMER_GROUP)
            .arg("-")
            .arg("+")
            .arg(1000)
            .query_async(&mut redis)
            .await?;
        let entries: redis::Value = redis::cmd("XRANGE")
            .arg(&stream)
            .arg("-")
            .arg("+")
            .query_async(&mut redis)
            .await?;
        let Some(id) = entry_of(&entries, key) else {
            return Ok(false);
        };
        let Some(consumer) = pending_owner(&pending, &id) else {
            return Ok(false);
        };
        let idle = self.settings.visibility_timeout + Duration::from_secs(1);
        let _: redis::Value = redis::cmd("XCLAIM")
            .arg(&stream)
            .arg(CONSUMER_GROUP)
            .arg(&consumer)
            .arg(0)
            .arg(&id)
            .arg("IDLE")
            .arg(idle.as_millis() as u64)
            .arg("JUSTID")
            .query_async(&mut redis)
            .await?;
        Ok(true)
    }

    /// Ends the blocking reads workers wait in, as if their block timeout ran out: time passed
    /// for the deliveries just aged, so it passed for the reads too, and a worker polls again
    /// (and reclaims) at once instead of at the end of its block. A blocked read ended this way
    /// returns what a timeout returns, which every worker handles.
    async fn wake_blocked_readers(&self) -> Result<()> {
        let mut redis = self.admin.redis.clone();
        let clients: String = redis::cmd("CLIENT")
            .arg("LIST")
            .arg("TYPE")
            .arg("normal")
            .query_async(&mut redis)
            .await?;
        for id in blocked_stream_readers(&clients) {
            let _: redis::Value = redis::cmd("CLIENT")
                .arg("UNBLOCK")
                .arg(id)
                .query_async(&mut redis)
                .await?;
        }
        Ok(())
    }

    /// Heals, lets every worker run free until every request is terminal (expiring the leases
    /// and deliveries of jobs nobody works on), judges what concerns this case's requests, and
    /// leaves every worker held before its next queue poll, ready for the next case.
    pub(super) async fn finish(
        &mut self,
        bed: &TestBed,
        schedule: Schedule<WireStep>,
        expected: Option<&[Vec<String>]>,
    ) -> Result<Outcome<WireStep>> {
        let step = self.steps_run.len() + 1;
        self.recorder.step(
            step,
            "drain: heal, release every hold, let the workers finish".into(),
        );
        self.recorder.observe(Observation::Draining);
        self.plane.services.heal_all().await?;
        // Still under the gates, in worker order: each worker finishes what the schedule left
        // in its hands, up to its next queue poll. Only if that leaves a job open (a worker
        // died with it, or waits on another) do the workers run free while time passes.
        let started = Instant::now();
        self.settle().await?;
        let open = self.open_jobs().await?;
        let mut settled = open.is_empty();
        let drained = !settled;
        if drained {
            for gate in &self.gates {
                gate.open();
            }
            settled = self.drain(bed, &open).await?;
            self.settle().await?;
        }
        tracing::debug!(
            drained,
            elapsed_us = started.elapsed().as_micros() as u64,
            "wire case end"
        );
        // What the queue still holds for the case: a delivery left unacknowledged is never done.
        let mut queue = crate::reference::queue::Queue::over(self.admin.redis.clone(), &self.keys);
        for (key, deliveries) in queue.pending().await? {
            if self.submitted.iter().any(|r| r.idempotency_key == key) {
                self.recorder.observe(Observation::Pending {
                    key,
                    deliveries,
                    held: None,
                });
            }
        }
        self.recorder.observe(Observation::Drained { settled });
        let keys: Vec<String> = self
            .submitted
            .iter()
            .map(|r| r.idempotency_key.clone())
            .collect();
        // Only this case's events and rows: the processes' recorder and key prefix gather every
        // case's, and reading them all would make each case slower than the one before.
        let judged = Instant::now();
        let events = self.recorder.events_since(self.events_from);
        let rows = crate::history::read_rows_of(&self.admin.pg, &keys).await?;
        let mut history = crate::history::assemble(
            rows,
            bed.take_journals(self.keys.prefix()),
            self.keys.prefix(),
            events,
            self.submitted.clone(),
            self.plane.connections(),
        );
        history.epoch_unix_ms = Some(self.recorder.started_unix_ms());
        history.wire_origin_ms = Some(self.recorder.offset_of(bed.wire_origin()));
        history.journal.retain(|entry| {
            entry
                .request
                .as_ref()
                .is_some_and(|call| keys.contains(&call.idempotency_key))
        });
        history.lease_ttl_ms = Some(self.settings.lease_ttl.as_millis() as u64);
        history.wire_recorded = true;
        let divergence = expected.and_then(|expected| diverged(expected, &self.trace));
        let mut timeouts: Vec<String> = Vec::new();
        for gate in &self.gates {
            timeouts.extend(gate.timeouts.lock().expect("poisoned").iter().cloned());
        }
        timeouts.extend(
            self.notes
                .iter()
                .filter(|n| n.contains("without the schedule"))
                .cloned(),
        );
        let outputs = self.plane.workers.outputs.lock().expect("poisoned").clone();
        let collected = judged.elapsed();
        let outcome = Outcome {
            schedule,
            case: CaseResult::judge(history, &self.settings.invariants),
            trace: std::mem::take(&mut self.trace),
            divergence,
            timeouts,
            notes: std::mem::take(&mut self.notes),
            outputs,
            elapsed: self.started.elapsed(),
        };
        tracing::debug!(
            events = outcome.case.history.events.len(),
            collected_us = collected.as_micros() as u64,
            elapsed_us = judged.elapsed().as_micros() as u64,
            "wire case judged"
        );
        self.clean().await?;
        Ok(outcome)
    }

    /// Every worker held before its next queue poll, in worker order (a worker that left,
    /// declining a version, is started again).
    async fn settle(&mut self) -> Result<()> {
        for index in 0..self.plane.workers.procs.len() {
            if self.plane.workers.procs[index]
                .child
                .try_wait()
                .ok()
                .flatten()
                .is_some()
            {
                self.replace(index)?;
            }
        }
        for gate in &self.gates {
            gate.close();
        }
        // A worker that ran free may wait in a blocking read that nothing will answer now (the
        // case added its work before): its block timeout passing changes nothing, so end it.
        self.wake_blocked_readers().await?;
        for worker in 0..self.gates.len() {
            let wait = if self.fresh[worker] {
                self.settings.start
            } else {
                self.settings.arrive
            };
            let mut notes = Vec::new();
            for _ in 0..100 {
                match self.gates[worker].arrival(wait, &mut notes).await {
                    Some((_, true)) => break,
                    Some((_, false)) => {
                        self.gates[worker].release(self.settings.answer).await;
                    }
                    None => break,
                }
            }
            self.fresh[worker] = false;
        }
        Ok(())
    }

    /// Between cases: the namespace's cache and version pointer gone, no delivery of this case
    /// left to claim, and the stream emptied (its group and last id stay).
    async fn clean(&mut self) -> Result<()> {
        let mut redis = self.admin.redis.clone();
        let found =
            crate::contract::worker::scan_keys(&mut redis, &format!("{}inf:*", self.keys.prefix()))
                .await?;
        if !found.is_empty() {
            let _: i64 = redis::cmd("DEL")
                .arg(&found)
                .query_async(&mut redis)
                .await?;
        }
        let _: i64 = redis::cmd("DEL")
            .arg(self.keys.active_version())
            .query_async(&mut redis)
            .await?;
        let stream = self.keys.stream();
        let pending: redis::Value = redis::cmd("XPENDING")
            .arg(&stream)
            .arg(CONSUMER_GROUP)
            .arg("-")
            .arg("+")
            .arg(1000)
            .query_async(&mut redis)
            .await?;
        if let redis::Value::Array(entries) = pending {
            let ids: Vec<String> = entries
                .iter()
                .filter_map(|entry| match entry {
                    redis::Value::Array(parts) => parts.first().and_then(text_of),
                    _ => None,
                })
                .collect();
            if !ids.is_empty() {
                let _: i64 = redis::cmd("XACK")
                    .arg(&stream)
                    .arg(CONSUMER_GROUP)
                    .arg(&ids)
                    .query_async(&mut redis)
                    .await?;
            }
        }
        // Every entry is done with: the next case's reads of the stream (a delivery's entry, the
        // newest id) see its own entries only, not every case's since the processes started.
        let _: i64 = redis::cmd("XTRIM")
            .arg(&stream)
            .arg("MAXLEN")
            .arg(0)
            .query_async(&mut redis)
            .await?;
        Ok(())
    }

    /// Stops the processes and hands the links back (holding nothing).
    pub(super) async fn stop(mut self) {
        let mut spares: Vec<Spare> = self.spares.drain(..).flatten().collect();
        for gate in self
            .gates
            .iter()
            .chain(spares.iter().map(|spare| &spare.gate))
        {
            gate.open();
        }
        let procs = self.plane.workers.procs.iter_mut();
        for proc in procs.chain(spares.iter_mut().map(|spare| &mut spare.proc)) {
            signal(proc, Signal::SIGCONT);
            stop(proc, Duration::from_secs(2)).await;
        }
        for reader in std::mem::take(&mut self.plane.workers.readers) {
            let _ = tokio::time::timeout(Duration::from_secs(2), reader).await;
        }
        for link in self.plane.services.release_links() {
            link.links.hold(None);
        }
    }

    /// The case's requests whose job is not terminal.
    /// The case's requests whose job is not terminal, or whose delivery is still pending (the
    /// queue will hand it out again: the work is not over).
    async fn open_jobs(&self) -> Result<Vec<String>> {
        let jobs = read_jobs(&self.admin.pg, self.keys.prefix()).await?;
        let mut queue = crate::reference::queue::Queue::over(self.admin.redis.clone(), &self.keys);
        let pending: Vec<String> = queue.pending().await?.into_iter().map(|(k, _)| k).collect();
        Ok(self
            .submitted
            .iter()
            .filter(|r| {
                pending.contains(&r.idempotency_key)
                    || jobs
                        .iter()
                        .find(|j| j.idempotency_key == r.idempotency_key)
                        .is_none_or(|j| !j.status().is_ok_and(|s| s.is_terminal()))
            })
            .map(|r| r.idempotency_key.clone())
            .collect())
    }

    /// Lets the workers run free until no job is open; `open` are the jobs open at its start.
    async fn drain(&mut self, _bed: &TestBed, open: &[String]) -> Result<bool> {
        let deadline = Instant::now() + self.settings.drain;
        // The settle already left every live worker at its next queue poll, so a job still open
        // now waits for time to pass (its holder died, or holds it past the schedule): age it at
        // once instead of waiting a quiet period that would only find the same.
        self.expire_open(open).await?;
        let mut last_expiry = Instant::now();
        loop {
            let open = self.open_jobs().await?;
            if open.is_empty() {
                return Ok(true);
            }
            if Instant::now() > deadline || crate::interrupt::requested().is_some() {
                return Ok(false);
            }
            // Nobody progressed for a while: time passes again (leases and visibility timeouts
            // run out) so a job whose worker died or gave up since is taken again.
            let quiet = Duration::from_millis(600);
            let last = self
                .gates
                .iter()
                .filter_map(|g| g.progress())
                .max()
                .unwrap_or(self.started);
            if last.elapsed() > quiet && last_expiry.elapsed() > quiet {
                self.expire_open(&open).await?;
                last_expiry = Instant::now();
            }
            // Checking costs two local queries; a job done is seen within a few milliseconds.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Lets time pass for the open jobs: their leases (up to the liveness bound) and deliveries
    /// expire, so another worker may take them. A lease set to outlive the bound is recorded.
    async fn expire_open(&mut self, open: &[String]) -> Result<()> {
        if open.is_empty() {
            return Ok(());
        }
        // Up to the liveness bound: a lease set to outlive it keeps its job waiting.
        let bound = self.settings.lease_ttl * 2;
        let (_, outliving) = self
            .plane
            .services
            .expire_leases_within(open, bound)
            .await?;
        let mut aged = false;
        for key in open {
            aged |= self.expire_delivery(key).await?;
        }
        if aged {
            self.wake_blocked_readers().await?;
        }
        for (key, ttl_ms) in outliving {
            if !self.outliving.contains(&key) {
                self.outliving.push(key.clone());
                self.recorder.observe(Observation::LeaseOutlivesBound {
                    key,
                    ttl_ms,
                    bound_ms: bound.as_millis() as u64,
                });
            }
        }
        Ok(())
    }
}

/// The ids of the clients in a `CLIENT LIST` reply that wait in a blocking stream read.
pub(super) fn blocked_stream_readers(clients: &str) -> Vec<u64> {
    clients
        .lines()
        .filter_map(|line| {
            let field = |name: &str| {
                line.split_whitespace()
                    .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
            };
            let blocked = field("flags").is_some_and(|flags| flags.contains('b'));
            let reading = field("cmd").is_some_and(|cmd| {
                cmd.eq_ignore_ascii_case("xreadgroup") || cmd.eq_ignore_ascii_case("xread")
            });
            (blocked && reading)
                .then(|| field("id")?.parse().ok())
                .flatten()
        })
        .collect()
}

pub(super) fn diverged(expected: &[Vec<String>], got: &[Vec<String>]) -> Option<Divergence> {
    let steps = expected.len().max(got.len());
    (0..steps).find_map(|i| {
        let (e, g) = (
            expected.get(i).cloned().unwrap_or_default(),
            got.get(i).cloned().unwrap_or_default(),
        );
        (e != g).then_some(Divergence {
            step: i + 1,
            expected: e,
            got: g,
        })
    })
}
