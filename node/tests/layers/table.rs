//! The two tables under `## Layers` in `docs/src/architecture/layers.md`: the crate table (one
//! row per crate of the workspace: its layer and directory) and the module table (the layers of
//! `mesh-node`'s modules). Both count layers on one scale, so a module may use a crate of its own
//! layer or below.

use std::collections::BTreeMap;

/// Where the layer tables live, relative to the workspace root.
pub const TABLE_DOC: &str = "docs/src/architecture/layers.md";
/// The heading the tables sit under.
pub const TABLE_HEADING: &str = "## Layers";

/// Where a module sits: its layer and the table row that says so.
#[derive(Debug)]
pub struct Placement {
    pub layer: u32,
    pub row: String,
}

/// Module name → where it sits.
pub type Layers = BTreeMap<String, Placement>;

/// Where a crate sits: its layer, its directory (relative to the workspace root, no trailing
/// `/`) and the row that says so.
#[derive(Debug)]
pub struct CrateRow {
    pub layer: u32,
    pub dir: String,
    pub row: String,
}

/// Crate name (`mesh-cert`) → its row.
pub type Crates = BTreeMap<String, CrateRow>;

/// The markdown tables between the `## Layers` heading and the next heading, each as its rows
/// (header first); `None` when there is no such heading.
fn tables(doc: &str) -> Option<Vec<Vec<&str>>> {
    let heading = doc
        .lines()
        .position(|line| line.trim_end() == TABLE_HEADING)?;
    let mut tables = Vec::new();
    let mut current: Vec<&str> = Vec::new();
    for line in doc
        .lines()
        .skip(heading + 1)
        .take_while(|line| !line.starts_with("# ") && !line.starts_with("## "))
    {
        if line.trim_start().starts_with('|') {
            current.push(line);
        } else if !current.is_empty() {
            tables.push(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() {
        tables.push(current);
    }
    Some(tables)
}

/// The cells of a row, trimmed: `| 1 | `a` |` → `["1", "`a`"]`.
fn cells(row: &str) -> Vec<&str> {
    row.trim()
        .trim_matches('|')
        .split('|')
        .map(str::trim)
        .collect()
}

/// Whether `table`'s header names `crate` in its second column (the crate table).
fn is_crate_table(table: &[&str]) -> bool {
    table
        .first()
        .and_then(|header| {
            cells(header)
                .get(1)
                .map(|cell| cell.eq_ignore_ascii_case("crate"))
        })
        .unwrap_or(false)
}

/// The rows under the header and its `|---|` row; `None` when there is no `|---|` row.
fn body<'t>(table: &'t [&'t str]) -> Option<&'t [&'t str]> {
    let separator = table.iter().position(|row| {
        row.chars()
            .all(|c| matches!(c, '|' | '-' | ':' | ' ' | '\t'))
    })?;
    Some(&table[separator + 1..])
}

/// The names between backticks: "`a`, `b`" splits to ["", "a", ", ", "b", ""].
fn backticked(cell: &str) -> impl Iterator<Item = &str> {
    cell.split('`').skip(1).step_by(2)
}

/// Reads the module table: the first table after the `## Layers` heading that is not the crate
/// table. `None` (and a problem) when there is no such table.
///
/// A row is `| 2 | `discovery`, `peers` | free text |`: the layer number, then the names in
/// backticks. The header row and the `|---|` row under it are skipped. Names with a `-` are
/// crates (their layers are the crate table's) and are skipped.
pub fn parse_layer_table(doc: &str, problems: &mut Vec<String>) -> Option<Layers> {
    let Some(tables) = tables(doc) else {
        problems.push(format!(
            "{TABLE_DOC} has no `{TABLE_HEADING}` heading; the layer table goes under it"
        ));
        return None;
    };
    let table = tables.iter().find(|table| !is_crate_table(table));
    let Some(rows) = table.and_then(|table| body(table)) else {
        problems.push(format!(
            "{TABLE_DOC}: no table (a header row, a `|---|` row, then one row per layer) under \
             `{TABLE_HEADING}`"
        ));
        return None;
    };

    let mut layers = Layers::new();
    for row in rows {
        let row = row.trim();
        let cells = cells(row);
        let (Some(number), Some(names)) = (cells.first(), cells.get(1)) else {
            problems.push(format!(
                "{TABLE_DOC}, row `{row}`: expected `| layer | modules |`"
            ));
            continue;
        };
        let Ok(layer) = number.trim_matches('*').parse::<u32>() else {
            problems.push(format!(
                "{TABLE_DOC}, row `{row}`: the first cell is not a layer number"
            ));
            continue;
        };
        for name in backticked(names) {
            if name.contains('-') {
                continue; // a crate, not a module of node/src
            }
            if let Some(earlier) = layers.get(name) {
                problems.push(format!(
                    "{TABLE_DOC}, row `{row}`: `{name}` is already on layer {}; list it once",
                    earlier.layer
                ));
                continue;
            }
            let placement = Placement {
                layer,
                row: row.to_string(),
            };
            layers.insert(name.to_string(), placement);
        }
    }
    if rows.is_empty() {
        problems.push(format!(
            "{TABLE_DOC}: the table under `{TABLE_HEADING}` has no rows"
        ));
    }
    Some(layers)
}

/// The names with a `-` (crates) that the module table lists, with their rows: crates belong in
/// the crate table, so that a crate's layer is said once.
pub fn crates_in_module_table(doc: &str) -> Vec<(String, String)> {
    let tables = tables(doc).unwrap_or_default();
    let Some(rows) = tables
        .iter()
        .find(|table| !is_crate_table(table))
        .and_then(|table| body(table))
    else {
        return Vec::new();
    };
    rows.iter()
        .flat_map(|row| {
            let names = cells(row).get(1).copied().unwrap_or_default();
            backticked(names)
                .filter(|name| name.contains('-'))
                .map(|name| (name.to_string(), row.trim().to_string()))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Reads the crate table under `## Layers`: the table whose header's second column is `crate`.
/// `None` when there is none; the problems say what is wrong with its rows.
///
/// A row is `| 1 | `mesh-cert` | `node/cert/` | free text |`: the layer number, the crate's
/// name and its directory, each in backticks.
pub fn parse_crate_table(doc: &str, problems: &mut Vec<String>) -> Option<Crates> {
    let tables = tables(doc)?;
    let rows = tables
        .iter()
        .find(|table| is_crate_table(table))
        .and_then(|table| body(table))?;
    let mut crates = Crates::new();
    for row in rows {
        let row = row.trim();
        let cells = cells(row);
        let layer = cells
            .first()
            .and_then(|number| number.trim_matches('*').parse::<u32>().ok());
        let name = cells.get(1).and_then(|cell| backticked(cell).next());
        let dir = cells.get(2).and_then(|cell| backticked(cell).next());
        let (Some(layer), Some(name), Some(dir)) = (layer, name, dir) else {
            problems.push(format!(
                "{TABLE_DOC}, crate table, row `{row}`: expected `| layer | `crate` | \
                 `directory/` | what it is |`"
            ));
            continue;
        };
        if crates.contains_key(name) {
            problems.push(format!(
                "{TABLE_DOC}, crate table, row `{row}`: `{name}` has a row already; one row per \
                 crate"
            ));
            continue;
        }
        let dir = dir.trim_end_matches('/').to_string();
        let row = row.to_string();
        crates.insert(name.to_string(), CrateRow { layer, dir, row });
    }
    Some(crates)
}
