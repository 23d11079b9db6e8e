//! What an MCP tool must look like before a model sees it, and what a call's arguments must look
//! like before its server does: [`check_tool`] (a name that namespaces into a valid function
//! name, an object schema of bounded size that compiles) and [`check_arguments`] (the arguments
//! against that schema). Pure functions of their inputs; they talk to no server.

use jsonschema::Validator;
use mesh_domain::{
    McpToolInfo, Tier,
    mcp::{self, MAX_DESCRIPTION, MAX_FUNCTION_NAME, MAX_SCHEMA_BYTES},
    text::truncate,
};
use serde_json::{Map, Value};

/// Most schema violations named in one refusal.
const MAX_ERRORS_NAMED: usize = 5;

/// An MCP tool that passed the checks: what is advertised, and what checks a call.
#[derive(Debug)]
pub(crate) struct CheckedTool {
    /// As advertised and offered to models.
    pub info: McpToolInfo,
    /// Its name on its server.
    pub remote_name: String,
    /// Its compiled input schema.
    pub validator: Validator,
}

/// Checks one tool `server` listed: its namespaced name, its schema's size and shape (an
/// object schema, as OpenAI's function parameters must be) and that the schema compiles.
/// `Err` says why the tool is skipped.
pub(crate) fn check_tool(
    server: &str,
    tier: Tier,
    name: &str,
    description: Option<&str>,
    schema: &Map<String, Value>,
) -> Result<CheckedTool, String> {
    let namespaced = mcp::tool_name(server, name).ok_or_else(|| {
        format!(
            "`{server}__{name}` is no valid function name (at most {MAX_FUNCTION_NAME} ASCII letters, digits, `_` or `-`)"
        )
    })?;
    let schema = Value::Object(schema.clone());
    let size = schema.to_string().len();
    if size > MAX_SCHEMA_BYTES {
        return Err(format!(
            "its input schema has {size} bytes, more than {MAX_SCHEMA_BYTES}"
        ));
    }
    if schema.get("type").and_then(Value::as_str) != Some("object") {
        return Err("its input schema is not `\"type\": \"object\"`".into());
    }
    let validator = jsonschema::validator_for(&schema)
        .map_err(|e| format!("its input schema is not a valid JSON schema: {e}"))?;
    Ok(CheckedTool {
        info: McpToolInfo {
            name: namespaced,
            description: truncate(description.unwrap_or_default(), MAX_DESCRIPTION).to_owned(),
            input_schema: schema.into(),
            tier,
        },
        remote_name: name.to_owned(),
        validator,
    })
}

/// Whether `arguments` match the schema; `Err` names up to five violations, each with where it
/// is (`/timezone: 42 is not of type "string"`).
pub(crate) fn check_arguments(validator: &Validator, arguments: &Value) -> Result<(), String> {
    let errors: Vec<String> = validator
        .iter_errors(arguments)
        .take(MAX_ERRORS_NAMED)
        .map(|error| {
            let at = error.instance_path().to_string();
            let at = if at.is_empty() {
                "(the arguments)"
            } else {
                &at
            };
            truncate(&format!("{at}: {error}"), 300).to_owned()
        })
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn object(value: Value) -> Map<String, Value> {
        value.as_object().cloned().expect("an object")
    }

    fn time_schema() -> Map<String, Value> {
        object(json!({
            "type": "object",
            "properties": {"timezone": {"type": "string"}},
            "required": ["timezone"],
        }))
    }

    #[test]
    fn a_good_tool_is_namespaced_and_its_description_bounded() {
        let long = "d".repeat(5000);
        let tool = check_tool(
            "time",
            Tier::Read,
            "get_current_time",
            Some(&long),
            &time_schema(),
        )
        .expect("valid");
        assert_eq!(tool.info.name, "time__get_current_time");
        assert_eq!(tool.remote_name, "get_current_time");
        assert_eq!(tool.info.tier, Tier::Read);
        assert_eq!(tool.info.description.len(), MAX_DESCRIPTION);
    }

    #[test]
    fn invalid_oversized_or_badly_named_tools_are_skipped_with_the_reason() {
        let cases = [
            ("read.file", time_schema(), "no valid function name"),
            (
                "t",
                object(json!({"type": "object", "description": "x".repeat(MAX_SCHEMA_BYTES)})),
                "more than",
            ),
            (
                "t",
                object(json!({"type": "array"})),
                "not `\"type\": \"object\"`",
            ),
            (
                "t",
                object(json!({"properties": {}})),
                "not `\"type\": \"object\"`",
            ),
            (
                "t",
                object(json!({"type": "object", "properties": {"a": {"type": "no-such-type"}}})),
                "not a valid JSON schema",
            ),
            (
                "t",
                object(
                    json!({"type": "object", "properties": {"a": {"$ref": "https://example.invalid/s.json"}}}),
                ),
                "not a valid JSON schema",
            ),
        ];
        for (name, schema, why) in cases {
            let error =
                check_tool("s", Tier::Write, name, None, &schema).expect_err("must be skipped");
            assert!(error.contains(why), "{name}: {error}");
        }
    }

    #[test]
    fn arguments_are_checked_against_the_schema_and_the_violations_named() {
        let tool = check_tool("time", Tier::Read, "now", None, &time_schema()).expect("valid");
        assert_eq!(
            check_arguments(&tool.validator, &json!({"timezone": "UTC"})),
            Ok(())
        );
        let error =
            check_arguments(&tool.validator, &json!({"timezone": 42})).expect_err("wrong type");
        assert!(error.starts_with("/timezone: "), "{error}");
        let error = check_arguments(&tool.validator, &json!({})).expect_err("missing");
        assert!(error.contains("timezone"), "{error}");
    }
}
