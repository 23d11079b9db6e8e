//! Hooks: typed stages of the agent loop with explicit order numbers, and the supervisor built
//! from them.
//!
//! A hook sees typed facts (the tool call, its parsed arguments, the outcome, the loop's
//! counters), never message text, and answers with a [`Verdict`]. Hooks of one stage run in
//! ascending order; the first verdict that is not `Continue` wins. Two hooks with the same stage
//! and order are a startup error ([`HookError::Duplicate`]), never a silent reorder.
//!
//! The supervisor is these hooks: [`ArgumentsGuard`] (malformed JSON: one corrective message,
//! then `malformed tool call`), [`TierGate`] (unknown tools, and calls above the task's tier, are
//! refused and the model sees why), [`RepeatGuard`] (the same call 3 times in a row: an
//! intervention; a 4th: `loop detected`) and [`FailureCounter`] (consecutive failures per tool,
//! reset on success).

use std::collections::{BTreeMap, HashMap};

use mesh_domain::{TaskError, Tier};
use serde_json::Value;

/// Where in the loop a hook runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    /// Before each model call.
    BeforeModelCall,
    /// After each model answer.
    AfterModelCall,
    /// Before a tool call runs.
    BeforeTool,
    /// After a tool call ran (or was refused).
    AfterTool,
    /// When the task ends.
    TaskEnd,
}

/// A tool call as hooks see it.
#[derive(Debug, Clone)]
pub struct CallFacts<'a> {
    /// Tool name.
    pub name: &'a str,
    /// Raw arguments text.
    pub raw_arguments: &'a str,
    /// Parsed arguments; `None` when not a JSON object.
    pub arguments: Option<&'a Value>,
    /// The tool's tier; `None` when no such tool is registered.
    pub tool_tier: Option<Tier>,
}

/// How a tool call went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Whether it succeeded.
    pub ok: bool,
    /// Whether it actually ran (false when refused).
    pub ran: bool,
}

/// What the loop knows that hooks may read and update.
#[derive(Debug, Default)]
pub struct LoopState {
    /// The task's maximum tier.
    pub tier: Option<Tier>,
    /// Tools the task may call (a persona's list); `None` = any registered tool.
    pub allowed_tools: Option<Vec<String>>,
    /// Malformed-argument calls so far.
    pub malformed: u32,
    /// The last call, as (name, parsed arguments), and how many times in a row it came.
    pub last_call: Option<(String, Option<Value>)>,
    /// Consecutive identical calls.
    pub repeats: u32,
    /// Consecutive failures per tool.
    pub failures: HashMap<String, u32>,
}

/// A hook's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Nothing to say.
    Continue,
    /// Do not run the tool; `message` is its result for the model.
    Refuse {
        /// The rule, e.g. `tier`.
        rule: &'static str,
        /// What the model is told.
        message: String,
    },
    /// Run as planned, and add `message` to the conversation.
    Intervene {
        rule: &'static str,
        /// What the model is told.
        message: String,
    },
    /// End the task with this error.
    Fail(TaskError),
}

/// The facts a hook gets.
#[derive(Debug)]
pub struct HookInput<'a> {
    /// The call (tool stages).
    pub call: Option<&'a CallFacts<'a>>,
    /// The outcome (after-tool stage).
    pub outcome: Option<Outcome>,
}

pub trait Hook: Send + Sync + std::fmt::Debug {
    /// Name, for errors and logs.
    fn name(&self) -> &'static str;
    /// The stage it runs in.
    fn stage(&self) -> Stage;
    /// Its position within the stage (ascending).
    fn order(&self) -> u32;
    /// Looks at the facts and answers with a verdict.
    fn run(&self, input: &HookInput<'_>, state: &mut LoopState) -> Verdict;
}

/// Hooks by stage, in order.
#[derive(Debug, Default)]
pub struct Hooks {
    stages: BTreeMap<Stage, Vec<Box<dyn Hook>>>,
}

/// Hook registration errors.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HookError {
    /// Two hooks claim the same place.
    #[error(
        "hooks `{first}` and `{second}` both run at {stage:?} with order {order}; give one another order number"
    )]
    Duplicate {
        /// The stage both claim.
        stage: Stage,
        /// The order number both claim.
        order: u32,
        /// First hook.
        first: &'static str,
        /// Second hook.
        second: &'static str,
    },
}

impl Hooks {
    /// Registers `hooks`, refusing two at the same stage and order.
    pub fn new(hooks: Vec<Box<dyn Hook>>) -> Result<Self, HookError> {
        let mut stages: BTreeMap<Stage, Vec<Box<dyn Hook>>> = BTreeMap::new();
        for hook in hooks {
            let list = stages.entry(hook.stage()).or_default();
            if let Some(other) = list.iter().find(|h| h.order() == hook.order()) {
                return Err(HookError::Duplicate {
                    stage: hook.stage(),
                    order: hook.order(),
                    first: other.name(),
                    second: hook.name(),
                });
            }
            list.push(hook);
            list.sort_by_key(|h| h.order());
        }
        Ok(Self { stages })
    }

    /// The supervisor's hooks.
    pub fn supervisor() -> Result<Self, HookError> {
        Self::new(vec![
            Box::new(ArgumentsGuard),
            Box::new(TierGate),
            Box::new(RepeatGuard),
            Box::new(FailureCounter),
        ])
    }

    /// Runs the hooks of `stage`; the first non-`Continue` verdict wins.
    pub fn run(&self, stage: Stage, input: &HookInput<'_>, state: &mut LoopState) -> Verdict {
        for hook in self.stages.get(&stage).into_iter().flatten() {
            let verdict = hook.run(input, state);
            if verdict != Verdict::Continue {
                return verdict;
            }
        }
        Verdict::Continue
    }
}

/// Malformed tool arguments: one corrective message, then `malformed tool call`.
#[derive(Debug)]
pub(crate) struct ArgumentsGuard;

impl Hook for ArgumentsGuard {
    fn name(&self) -> &'static str {
        "arguments_guard"
    }
    fn stage(&self) -> Stage {
        Stage::BeforeTool
    }
    fn order(&self) -> u32 {
        10
    }
    fn run(&self, input: &HookInput<'_>, state: &mut LoopState) -> Verdict {
        let Some(call) = input.call else {
            return Verdict::Continue;
        };
        if call.arguments.is_some() {
            return Verdict::Continue;
        }
        state.malformed += 1;
        if state.malformed >= 2 {
            return Verdict::Fail(TaskError::Protocol {
                message: format!(
                    "malformed tool call: the arguments of `{}` were not a JSON object again after a correction",
                    call.name
                ),
            });
        }
        Verdict::Refuse {
            rule: "malformed_arguments",
            message: format!(
                "The arguments of your `{}` call are not a valid JSON object. Call it again with arguments that are one JSON object matching the tool's schema.",
                call.name
            ),
        }
    }
}

/// Unknown tools and calls above the task's tier are refused; the model sees why.
#[derive(Debug)]
pub(crate) struct TierGate;

impl Hook for TierGate {
    fn name(&self) -> &'static str {
        "tier_gate"
    }
    fn stage(&self) -> Stage {
        Stage::BeforeTool
    }
    fn order(&self) -> u32 {
        20
    }
    fn run(&self, input: &HookInput<'_>, state: &mut LoopState) -> Verdict {
        let Some(call) = input.call else {
            return Verdict::Continue;
        };
        let allowed = state.tier.unwrap_or(Tier::Read);
        match call.tool_tier {
            None => Verdict::Refuse {
                rule: "unknown_tool",
                message: format!("Refused: there is no tool named `{}`.", call.name),
            },
            Some(_)
                if state
                    .allowed_tools
                    .as_ref()
                    .is_some_and(|names| !names.iter().any(|n| n == call.name)) =>
            {
                Verdict::Refuse {
                    rule: "not_allowed",
                    message: format!(
                        "Refused: `{}` is not among the tools this task may use.",
                        call.name
                    ),
                }
            }
            Some(tier) if tier > allowed => Verdict::Refuse {
                rule: "tier",
                message: format!(
                    "Refused: `{}` needs the `{tier}` tier and this task may only use `{allowed}`. Do not retry it; answer without it.",
                    call.name
                ),
            },
            Some(_) => Verdict::Continue,
        }
    }
}

/// The same call with the same arguments: the 3rd in a row gets an intervention, the 4th fails.
#[derive(Debug)]
pub(crate) struct RepeatGuard;

/// Identical calls in a row that trigger the intervention; one more fails the task.
pub(crate) const REPEAT_WARN: u32 = 3;

impl Hook for RepeatGuard {
    fn name(&self) -> &'static str {
        "repeat_guard"
    }
    fn stage(&self) -> Stage {
        Stage::BeforeTool
    }
    fn order(&self) -> u32 {
        30
    }
    fn run(&self, input: &HookInput<'_>, state: &mut LoopState) -> Verdict {
        let Some(call) = input.call else {
            return Verdict::Continue;
        };
        // Parsed arguments compare regardless of spacing and key order (also with serde_json's
        // `preserve_order`, which llguidance turns on: its maps compare as sets), where their
        // text would not.
        let key = (call.name.to_owned(), call.arguments.cloned());
        if state.last_call.as_ref() == Some(&key) {
            state.repeats += 1;
        } else {
            state.last_call = Some(key);
            state.repeats = 1;
        }
        if state.repeats > REPEAT_WARN {
            Verdict::Fail(TaskError::Gate {
                rule: "repeat".into(),
                action: format!("{}({})", call.name, call.raw_arguments),
                message: format!(
                    "loop detected: `{}` called {} times in a row with the same arguments",
                    call.name, state.repeats
                ),
            })
        } else if state.repeats == REPEAT_WARN {
            Verdict::Intervene {
                rule: "repeat",
                message: format!(
                    "You have called `{}` with the same arguments {REPEAT_WARN} times in a row and got the same result. Do not call it again with these arguments: use the results you have, change your approach, or give your final answer.",
                    call.name
                ),
            }
        } else {
            Verdict::Continue
        }
    }
}

/// Counts consecutive failures per tool, reset on success.
#[derive(Debug)]
pub(crate) struct FailureCounter;

impl Hook for FailureCounter {
    fn name(&self) -> &'static str {
        "failure_counter"
    }
    fn stage(&self) -> Stage {
        Stage::AfterTool
    }
    fn order(&self) -> u32 {
        10
    }
    fn run(&self, input: &HookInput<'_>, state: &mut LoopState) -> Verdict {
        if let (Some(call), Some(outcome)) = (input.call, input.outcome) {
            let count = state.failures.entry(call.name.to_owned()).or_default();
            *count = if outcome.ok { 0 } else { *count + 1 };
        }
        Verdict::Continue
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn before(hooks: &Hooks, state: &mut LoopState, name: &str, raw: &str) -> Verdict {
        let parsed: Option<Value> = serde_json::from_str(raw).ok().filter(Value::is_object);
        let tier = match name {
            "shell_exec" => Some(Tier::Shell),
            "file_write" => Some(Tier::Write),
            "ghost" => None,
            _ => Some(Tier::Read),
        };
        let call = CallFacts {
            name,
            raw_arguments: raw,
            arguments: parsed.as_ref(),
            tool_tier: tier,
        };
        hooks.run(
            Stage::BeforeTool,
            &HookInput {
                call: Some(&call),
                outcome: None,
            },
            state,
        )
    }

    #[test]
    fn the_same_call_three_times_intervenes_and_the_fourth_fails() {
        let hooks = Hooks::supervisor().expect("distinct orders");
        let mut state = LoopState::default();
        let args = r#"{"path": "a", "n": 1}"#;
        assert_eq!(
            before(&hooks, &mut state, "file_read", args),
            Verdict::Continue
        );
        // Same arguments in another key order and spacing are the same call.
        assert_eq!(
            before(&hooks, &mut state, "file_read", r#"{"n":1,"path":"a"}"#),
            Verdict::Continue
        );
        assert!(matches!(
            before(&hooks, &mut state, "file_read", args),
            Verdict::Intervene { rule: "repeat", .. }
        ));
        let Verdict::Fail(error) = before(&hooks, &mut state, "file_read", args) else {
            panic!("fourth call must fail");
        };
        assert!(error.to_string().contains("loop detected"), "{error}");
    }

    #[test]
    fn a_different_call_resets_the_repeat_count() {
        let hooks = Hooks::supervisor().expect("distinct orders");
        let mut state = LoopState::default();
        for _ in 0..2 {
            before(&hooks, &mut state, "file_read", r#"{"path": "a"}"#);
        }
        before(&hooks, &mut state, "file_read", r#"{"path": "b"}"#);
        assert_eq!(
            before(&hooks, &mut state, "file_read", r#"{"path": "a"}"#),
            Verdict::Continue
        );
    }

    #[test]
    fn malformed_arguments_get_one_correction_then_fail() {
        let hooks = Hooks::supervisor().expect("distinct orders");
        let mut state = LoopState::default();
        assert!(matches!(
            before(&hooks, &mut state, "file_read", "{not json"),
            Verdict::Refuse {
                rule: "malformed_arguments",
                ..
            }
        ));
        let Verdict::Fail(error) = before(&hooks, &mut state, "file_read", "[1, 2]") else {
            panic!("second malformed call must fail");
        };
        assert!(error.to_string().contains("malformed tool call"), "{error}");
    }

    #[test]
    fn tools_above_the_tier_and_unknown_tools_are_refused() {
        let hooks = Hooks::supervisor().expect("distinct orders");
        let mut state = LoopState {
            tier: Some(Tier::Read),
            ..LoopState::default()
        };
        assert!(matches!(
            before(&hooks, &mut state, "shell_exec", r#"{"command": "id"}"#),
            Verdict::Refuse { rule: "tier", .. }
        ));
        assert!(matches!(
            before(&hooks, &mut state, "ghost", "{}"),
            Verdict::Refuse {
                rule: "unknown_tool",
                ..
            }
        ));
        state.tier = Some(Tier::Shell);
        assert_eq!(
            before(&hooks, &mut state, "shell_exec", r#"{"command": "id"}"#),
            Verdict::Continue
        );
        state.allowed_tools = Some(vec!["file_read".into()]);
        assert!(matches!(
            before(&hooks, &mut state, "shell_exec", r#"{"command": "id"}"#),
            Verdict::Refuse {
                rule: "not_allowed",
                ..
            }
        ));
    }

    #[test]
    fn failures_are_counted_per_tool_and_reset_on_success() {
        let hooks = Hooks::supervisor().expect("distinct orders");
        let mut state = LoopState::default();
        let args = json!({});
        let call = CallFacts {
            name: "shell_exec",
            raw_arguments: "{}",
            arguments: Some(&args),
            tool_tier: Some(Tier::Shell),
        };
        for ok in [false, false, true, false] {
            hooks.run(
                Stage::AfterTool,
                &HookInput {
                    call: Some(&call),
                    outcome: Some(Outcome { ok, ran: true }),
                },
                &mut state,
            );
        }
        assert_eq!(state.failures["shell_exec"], 1);
    }

    #[test]
    fn two_hooks_at_the_same_stage_and_order_are_a_startup_error() {
        #[derive(Debug)]
        struct Clone10;
        impl Hook for Clone10 {
            fn name(&self) -> &'static str {
                "clone"
            }
            fn stage(&self) -> Stage {
                Stage::BeforeTool
            }
            fn order(&self) -> u32 {
                10
            }
            fn run(&self, _: &HookInput<'_>, _: &mut LoopState) -> Verdict {
                Verdict::Continue
            }
        }
        let err = Hooks::new(vec![Box::new(ArgumentsGuard), Box::new(Clone10)])
            .expect_err("duplicate order");
        assert_eq!(
            err,
            HookError::Duplicate {
                stage: Stage::BeforeTool,
                order: 10,
                first: "arguments_guard",
                second: "clone",
            }
        );
    }
}
