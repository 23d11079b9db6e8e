//! `mesh-cli cron`: schedules that run tasks on the fleet at set times.

use clap::Subcommand;
use mesh_domain::Target;
use mesh_proto::v1 as pb;
use serde_json::{Value, json};

use crate::{
    ConnArgs, channel, print_table,
    tasks::{TaskArgs, evaluation_json},
};

#[derive(Debug, Subcommand)]
pub(crate) enum CronCommand {
    /// Add a schedule: at each scheduled time one live node submits the task, and the mesh runs
    /// it where it fits (e.g. `cron add --name nightly --schedule "0 2 * * *" --role research
    /// "summarise today's notes"`). One of --role, --model and --persona is required.
    #[command(group(clap::ArgGroup::new("schedule_target").required(true).args(["role", "model", "persona"])))]
    Add {
        /// Unique name (letters, digits, `-`, `_`, `.`).
        #[arg(long)]
        name: String,
        /// Cron expression: 5 fields `minute hour day-of-month month day-of-week`, or 6 with a
        /// leading seconds field, or an alias such as `@daily`.
        #[arg(long, value_name = "EXPR")]
        schedule: String,
        /// IANA time zone the expression is read in, e.g. `Europe/Berlin` (default: UTC).
        #[arg(long = "tz", value_name = "ZONE")]
        timezone: Option<String>,
        /// While the previous firing still runs: `skip` this one or `allow` both.
        #[arg(long, value_parser = ["skip", "allow"], default_value = "skip")]
        overlap: String,
        /// After downtime, run the latest missed firing if it is at most this old, in seconds;
        /// older ones are recorded as missed.
        #[arg(long, value_name = "SECS", default_value_t = 3600)]
        catch_up: u32,
        /// Create it paused.
        #[arg(long)]
        disabled: bool,
        #[command(flatten)]
        task: Box<TaskArgs>,
        /// What the agent should do at each firing.
        #[arg(required = true)]
        prompt: Vec<String>,
    },
    /// List schedules with their owner node and next firing (all of them: the answer comes in
    /// pages, which it asks for one after another).
    Ls {
        /// Print JSON (a list of schedules).
        #[arg(long)]
        json: bool,
    },
    /// Delete a schedule.
    Rm {
        /// Schedule name.
        name: String,
    },
    /// Fire a schedule once now, from this node, outside its timetable.
    RunNow {
        /// Schedule name.
        name: String,
        /// Print the firing as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show a schedule's firings: scheduled time, owner, executing node, outcome.
    History {
        /// Schedule name.
        name: String,
        /// At most this many (the most recent).
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// Print JSON: a list of firings with fire_id, scheduled_at, owner, executed_on,
        /// status, task_id, error.
        #[arg(long)]
        json: bool,
    },
}

fn fail(status: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{}", status.message())
}

fn rfc3339(ms: u64) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(chrono::DateTime::from_timestamp_millis)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default()
}

fn target(task: Option<&pb::SubmitRequest>) -> String {
    task.and_then(|t| t.target.clone())
        .map(|target| Target::from(target).to_string())
        .unwrap_or_default()
}

fn schedule_json(s: &pb::CronSchedule) -> Value {
    let task = s.task.as_ref();
    json!({
        "id": s.id,
        "name": s.name,
        "schedule": s.schedule,
        "timezone": if s.timezone.is_empty() { "UTC" } else { &s.timezone },
        "target": target(task),
        "prompt": task.map(|t| t.prompt.clone()).unwrap_or_default(),
        "on": task.map(|t| t.on.clone()).unwrap_or_default(),
        "require_gpu": task.and_then(|t| t.require.as_ref()).is_some_and(|r| r.gpu),
        "evaluate": task.and_then(|t| t.evaluate.as_ref()).map(evaluation_json),
        "overlap": s.overlap,
        "catch_up_s": s.catch_up_s,
        "enabled": s.enabled,
        "created_at": rfc3339(s.created_at_ms),
        "created_on": s.created_on,
        "owner": s.owner,
        "next_at": if s.next_at_ms == 0 { Value::Null } else { rfc3339(s.next_at_ms).into() },
        "held": if s.held.is_empty() { Value::Null } else { s.held.clone().into() },
    })
}

/// Schedules in one `List` page asked for (the node also cuts a page at 2 MiB).
const LIST_PAGE: u32 = 1000;

/// Every schedule, asking page after page.
async fn list_all(
    client: &mut pb::cron_client::CronClient<tonic::transport::Channel>,
) -> anyhow::Result<Vec<pb::CronSchedule>> {
    let mut schedules = Vec::new();
    let mut after = String::new();
    loop {
        let page = client
            .list(pb::CronListRequest {
                limit: LIST_PAGE,
                after: after.clone(),
            })
            .await
            .map_err(fail)?
            .into_inner();
        schedules.extend(page.schedules);
        if page.next_after.is_empty() {
            return Ok(schedules);
        }
        // Names come in order: a cursor that does not move on would ask for the same page forever.
        if page.next_after <= after {
            anyhow::bail!(
                "the node answered `next_after = {}` after `{after}`: it does not page forward",
                page.next_after
            );
        }
        after = page.next_after;
    }
}

fn firing_json(f: &pb::CronFiring) -> Value {
    json!({
        "fire_id": f.fire_id,
        "schedule": f.schedule,
        "scheduled_at": rfc3339(f.scheduled_at_ms),
        "scheduled_at_ms": f.scheduled_at_ms,
        "owner": f.owner,
        "executed_on": f.executed_on,
        "task_id": f.task_id,
        "status": f.status,
        "error": f.error,
        "manual": f.manual,
        "updated_at": rfc3339(f.updated_at_ms),
    })
}

pub(crate) async fn run(conn: &ConnArgs, command: CronCommand) -> anyhow::Result<()> {
    let mut client = pb::cron_client::CronClient::new(channel(conn).await?);
    match command {
        CronCommand::Add {
            name,
            schedule,
            timezone,
            overlap,
            catch_up,
            disabled,
            task,
            prompt,
        } => {
            let added = client
                .add(pb::CronAddRequest {
                    name,
                    schedule,
                    timezone: timezone.unwrap_or_default(),
                    task: Some((*task).request(prompt.join(" "), None)),
                    overlap,
                    catch_up_s: catch_up,
                    disabled,
                })
                .await
                .map_err(fail)?
                .into_inner();
            show!(
                "added `{}` ({}); owner {}, next {}",
                added.name,
                added.schedule,
                added.owner,
                if added.next_at_ms == 0 {
                    "never".to_owned()
                } else {
                    rfc3339(added.next_at_ms)
                }
            );
        }
        CronCommand::Ls { json } => {
            let schedules = list_all(&mut client).await?;
            if json {
                let list: Vec<Value> = schedules.iter().map(schedule_json).collect();
                out!("{}", serde_json::to_string_pretty(&list)?);
                return Ok(());
            }
            let rows: Vec<[String; 7]> = schedules
                .iter()
                .map(|s| {
                    [
                        s.name.clone(),
                        s.schedule.clone(),
                        if s.timezone.is_empty() {
                            "UTC".into()
                        } else {
                            s.timezone.clone()
                        },
                        target(s.task.as_ref()),
                        s.owner.clone(),
                        if !s.held.is_empty() {
                            "held".into()
                        } else if !s.enabled {
                            "paused".into()
                        } else if s.next_at_ms == 0 {
                            "never".into()
                        } else {
                            rfc3339(s.next_at_ms)
                        },
                        s.overlap.clone(),
                    ]
                })
                .collect();
            print_table(
                &[
                    "NAME", "SCHEDULE", "TZ", "TARGET", "OWNER", "NEXT", "OVERLAP",
                ],
                &rows,
            );
            // Why the `held` ones never fire, once per reason.
            let mut reasons: Vec<&str> = schedules
                .iter()
                .map(|s| s.held.as_str())
                .filter(|why| !why.is_empty())
                .collect();
            reasons.sort_unstable();
            reasons.dedup();
            for why in reasons {
                out!("held: {why}");
            }
        }
        CronCommand::Rm { name } => {
            client
                .remove(pb::CronRemoveRequest { name: name.clone() })
                .await
                .map_err(fail)?;
            show!("removed `{name}`");
        }
        CronCommand::RunNow { name, json } => {
            let firing = client
                .run_now(pb::CronRunNowRequest { name })
                .await
                .map_err(fail)?
                .into_inner();
            if json {
                out!("{}", serde_json::to_string_pretty(&firing_json(&firing))?);
            } else {
                show!(
                    "fired {} ({}): task {}",
                    firing.fire_id,
                    firing.status,
                    firing.task_id
                );
            }
        }
        CronCommand::History { name, limit, json } => {
            let firings = client
                .history(pb::CronHistoryRequest { name, limit })
                .await
                .map_err(fail)?
                .into_inner()
                .firings;
            if json {
                let list: Vec<Value> = firings.iter().map(firing_json).collect();
                out!("{}", serde_json::to_string_pretty(&list)?);
                return Ok(());
            }
            let rows: Vec<[String; 6]> = firings
                .iter()
                .map(|f| {
                    [
                        rfc3339(f.scheduled_at_ms),
                        f.owner.clone(),
                        f.executed_on.clone(),
                        if f.manual {
                            format!("{} (manual)", f.status)
                        } else {
                            f.status.clone()
                        },
                        f.task_id.clone(),
                        f.error.clone(),
                    ]
                })
                .collect();
            print_table(
                &[
                    "SCHEDULED",
                    "OWNER",
                    "EXECUTED ON",
                    "STATUS",
                    "TASK",
                    "ERROR",
                ],
                &rows,
            );
        }
    }
    Ok(())
}
