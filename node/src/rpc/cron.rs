//! The `agentmesh.v1.Cron` service: translates the wire format for `cron::Scheduler`.

use std::sync::Arc;

use mesh_domain::{Principal, TaskSpec};
use mesh_proto::v1 as pb;
use tonic::{Request, Response, Status};

use crate::{
    admission::{Admission, Caller},
    cron::{self, CronError, Firing, LiveNode, Overlap, Schedule, Scheduler, Timetable},
};

/// Most firings one `History` answer carries.
const MAX_HISTORY: usize = 1000;
/// Schedules in a `List` answer when the request does not say, and at most.
const LIST_DEFAULT: usize = 100;
const LIST_MAX: usize = 1000;
/// Bytes of stored schedules in one `List` answer (one more than fits is still sent): well
/// within the answer's 4 MiB encoding limit.
const LIST_BYTES: usize = 2 << 20;

/// The Cron service.
#[derive(Debug, Clone)]
pub(crate) struct CronService {
    scheduler: Arc<Scheduler>,
    /// Checks that a schedule's creator may run its task's tier here.
    admission: Arc<Admission>,
    /// Whether callers present certificates (false in insecure mode).
    tls: bool,
}

impl CronService {
    /// Wraps the node's scheduler; `admission` checks creators.
    pub(crate) fn new(scheduler: Arc<Scheduler>, admission: Arc<Admission>, tls: bool) -> Self {
        Self {
            scheduler,
            admission,
            tls,
        }
    }

    /// The certificate calling, when callers present one.
    fn caller<T>(&self, request: &Request<T>) -> Result<Option<Principal>, Status> {
        Ok(if self.tls {
            Some(super::caller_identity(request)?.principal())
        } else {
            None
        })
    }

    /// Whether `caller` could run `task` here themselves (their own `run`): what adding a
    /// schedule and firing one by hand require, so neither lends a caller a schedule's tier.
    fn may_run(&self, caller: Option<&Principal>, task: &TaskSpec) -> Result<(), Status> {
        if let Some(caller) = caller {
            self.admission
                .allows(task.tier, &Caller::Certificate(caller.clone()), None)?;
        }
        Ok(())
    }

    /// The tonic server, with message size limits.
    pub(crate) fn into_server(self) -> pb::cron_server::CronServer<Self> {
        pb::cron_server::CronServer::new(self)
            .max_decoding_message_size(super::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(4 * super::MAX_MESSAGE_BYTES)
    }
}

/// A schedule on the wire: its owner among `live`, its next time after `now` by `timetable`,
/// and why the caps hold it back, if they do.
fn schedule_pb(
    schedule: &Schedule,
    timetable: &Timetable,
    held: Option<&str>,
    live: &[LiveNode],
    now: i64,
) -> pb::CronSchedule {
    let next = timetable.next_after(now);
    pb::CronSchedule {
        id: schedule.id.clone(),
        name: schedule.name.clone(),
        schedule: schedule.expression.clone(),
        timezone: schedule.timezone.clone(),
        task: Some(pb::SubmitRequest::from(&schedule.task)),
        overlap: schedule.overlap.to_string(),
        catch_up_s: schedule.catch_up_s,
        enabled: schedule.enabled,
        created_at_ms: u64::try_from(schedule.created_at_ms).unwrap_or(0),
        created_on: schedule.created_on.clone(),
        owner: cron::owner_of(schedule, live)
            .map(|node| node.name.clone())
            .unwrap_or_default(),
        next_at_ms: next.and_then(|n| u64::try_from(n).ok()).unwrap_or(0),
        held: held.unwrap_or_default().to_owned(),
    }
}

/// Every cron error has one status code; the memory's errors keep theirs.
impl From<CronError> for Status {
    fn from(error: CronError) -> Self {
        let message = error.to_string();
        match error {
            CronError::Invalid(_) => Status::invalid_argument(message),
            CronError::NotFound(_) => Status::not_found(message),
            CronError::Exists(_) => Status::already_exists(message),
            CronError::Full(_) => Status::resource_exhausted(message),
            CronError::Memory(memory) => memory.into(),
        }
    }
}

fn firing_pb(firing: &Firing) -> pb::CronFiring {
    pb::CronFiring {
        fire_id: firing.fire_id.clone(),
        schedule_id: firing.schedule_id.clone(),
        schedule: firing.schedule.clone(),
        scheduled_at_ms: u64::try_from(firing.scheduled_at_ms).unwrap_or(0),
        owner: firing.owner.clone(),
        executed_on: firing.executed_on.clone(),
        task_id: firing.task_id.clone(),
        status: firing.status.as_str().to_owned(),
        error: firing.error.clone(),
        updated_at_ms: u64::try_from(firing.updated_at_ms).unwrap_or(0),
        manual: firing.manual,
    }
}

#[tonic::async_trait]
impl pb::cron_server::Cron for CronService {
    async fn add(
        &self,
        request: Request<pb::CronAddRequest>,
    ) -> Result<Response<pb::CronSchedule>, Status> {
        // The creator: each firing runs as a task they started, capped as their own `run` is.
        let creator = self.caller(&request)?;
        let r = request.into_inner();
        cron::check_name(&r.name)?;
        let timetable = Timetable::parse(&r.schedule, &r.timezone)?;
        let overlap: Overlap = r.overlap.parse()?;
        let task = r
            .task
            .ok_or_else(|| Status::invalid_argument("task: required (prompt and target)"))?;
        if task.lineage.is_some() {
            return Err(Status::invalid_argument(
                "task.lineage: set by nodes only; leave it empty",
            ));
        }
        let task = TaskSpec::try_from(task)
            .map_err(|s| Status::invalid_argument(format!("task.{}", s.message())))?;
        // Refused at once when the creator could not run the task's tier here; whichever node
        // fires it checks again.
        self.may_run(creator.as_ref(), &task)?;
        let schedule = Schedule {
            id: uuid::Uuid::now_v7().to_string(),
            name: r.name,
            expression: r.schedule,
            timezone: r.timezone,
            task,
            overlap,
            catch_up_s: match r.catch_up_s {
                0 => cron::DEFAULT_CATCH_UP_S,
                n => n,
            },
            enabled: !r.disabled,
            created_at_ms: chrono::Utc::now().timestamp_millis(),
            created_on: self.scheduler.node_name().to_owned(),
            creator,
            origin: None,
        };
        let schedule = self.scheduler.add(schedule).await?;
        let now = chrono::Utc::now().timestamp_millis();
        Ok(Response::new(schedule_pb(
            &schedule,
            &timetable,
            None,
            &self.scheduler.live(),
            now,
        )))
    }

    async fn list(
        &self,
        request: Request<pb::CronListRequest>,
    ) -> Result<Response<pb::CronListResponse>, Status> {
        let r = request.into_inner();
        if !r.after.is_empty() {
            cron::check_name(&r.after)
                .map_err(|e| Status::invalid_argument(format!("after: {e}")))?;
        }
        let limit = match r.limit {
            0 => LIST_DEFAULT,
            n => (n as usize).min(LIST_MAX),
        };
        let (page, next_after) = self.scheduler.table().page(&r.after, limit, LIST_BYTES)?;
        let (live, now) = (self.scheduler.live(), chrono::Utc::now().timestamp_millis());
        Ok(Response::new(pb::CronListResponse {
            schedules: page
                .iter()
                .map(|s| {
                    schedule_pb(
                        &s.parsed.schedule,
                        &s.parsed.timetable,
                        s.held.as_deref(),
                        &live,
                        now,
                    )
                })
                .collect(),
            next_after: next_after.unwrap_or_default(),
        }))
    }

    async fn remove(
        &self,
        request: Request<pb::CronRemoveRequest>,
    ) -> Result<Response<pb::CronRemoveResponse>, Status> {
        self.scheduler.remove(&request.into_inner().name).await?;
        Ok(Response::new(pb::CronRemoveResponse {}))
    }

    async fn run_now(
        &self,
        request: Request<pb::CronRunNowRequest>,
    ) -> Result<Response<pb::CronFiring>, Status> {
        let caller = self.caller(&request)?;
        let stored = self.scheduler.table().get(&request.into_inner().name)?;
        let schedule = &stored.parsed.schedule;
        // The firing runs as the schedule's creator; whoever fires it by hand must be able to
        // run its task here too.
        self.may_run(caller.as_ref(), &schedule.task)?;
        let firing = self
            .scheduler
            .fire(schedule, chrono::Utc::now().timestamp_millis(), true)
            .await?;
        Ok(Response::new(firing_pb(&firing)))
    }

    async fn history(
        &self,
        request: Request<pb::CronHistoryRequest>,
    ) -> Result<Response<pb::CronHistoryResponse>, Status> {
        let r = request.into_inner();
        let stored = self.scheduler.table().get(&r.name)?;
        let limit = match r.limit {
            0 => 100,
            n => (n as usize).min(MAX_HISTORY),
        };
        let firings = self.scheduler.history(&stored.parsed.schedule.id)?;
        let skip = firings.len().saturating_sub(limit);
        Ok(Response::new(pb::CronHistoryResponse {
            firings: firings.iter().skip(skip).map(firing_pb).collect(),
        }))
    }
}
