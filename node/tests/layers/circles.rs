//! Circles: files, or top-level modules, that reach themselves through what they name.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::tree::Tree;

/// No file reaches itself through the files it names. `place` follows "circle of imports" in
/// the message (` in `mesh-cli` (bin mesh-cli)`; empty for `mesh-node`'s modules).
pub fn no_circle_of_files(tree: &Tree, place: &str, problems: &mut Vec<String>) {
    let graph: Graph<usize> = tree
        .edges
        .iter()
        .map(|(from, targets)| (*from, targets.keys().copied().collect()))
        .collect();
    for knot in knots(&graph) {
        let circle = circle_through(&graph, &knot);
        let names: Vec<String> = circle.iter().map(|file| tree.display(*file)).collect();
        let mut text = format!("circle of imports{place}: {}", names.join(" → "));
        for pair in circle.windows(2) {
            let via = &tree.edges[&pair[0]][&pair[1]];
            text += &format!("\n  {} names `{via}`", tree.display(pair[0]));
        }
        if knot.len() > circle.len() - 1 {
            let all: Vec<String> = knot.iter().map(|file| tree.display(*file)).collect();
            text += &format!(
                "\n  (part of a knot of {} files that all reach each other: {})",
                all.len(),
                all.join(", ")
            );
        }
        problems.push(text);
    }
}

/// No top-level module reaches itself through the modules it names (the crate root, when it is
/// a file of the tree, is the module `crate`).
pub fn no_circle_of_modules(tree: &Tree, place: &str, problems: &mut Vec<String>) {
    // module → module → (the file, the path) that first names it, for the message.
    let mut edges: BTreeMap<&str, BTreeMap<&str, (usize, &str)>> = BTreeMap::new();
    for (from, targets) in &tree.edges {
        for (to, via) in targets {
            let (a, b) = (&tree.files[*from].top, &tree.files[*to].top);
            if a != b {
                let first = edges.entry(a).or_default().entry(b);
                first.or_insert((*from, via));
            }
        }
    }
    let graph: Graph<&str> = edges
        .iter()
        .map(|(from, targets)| (*from, targets.keys().copied().collect()))
        .collect();
    for knot in knots(&graph) {
        let circle = circle_through(&graph, &knot);
        let mut text = format!("circle of modules{place}: {}", circle.join(" → "));
        for pair in circle.windows(2) {
            let (file, via) = edges[pair[0]][pair[1]];
            text += &format!("\n  {} names `{via}`", tree.display(file));
        }
        if knot.len() > circle.len() - 1 {
            text += &format!(
                "\n  (part of a knot of {} modules that all reach each other: {})",
                knot.len(),
                knot.join(", ")
            );
        }
        problems.push(text);
    }
}

/// A directed graph: node → the nodes it names.
type Graph<N> = BTreeMap<N, BTreeSet<N>>;

/// The knots of a graph: its strongly connected components with more than one node (every node
/// in one reaches every other), found with Kosaraju's algorithm: order the nodes by when a
/// depth-first search finishes them, then search the reversed graph in the opposite order; each
/// search there collects one component.
fn knots<N: Ord + Clone>(graph: &Graph<N>) -> Vec<Vec<N>> {
    fn finish<N: Ord + Clone>(
        graph: &Graph<N>,
        node: &N,
        seen: &mut BTreeSet<N>,
        order: &mut Vec<N>,
    ) {
        if seen.insert(node.clone()) {
            for next in graph.get(node).into_iter().flatten() {
                finish(graph, next, seen, order);
            }
            order.push(node.clone());
        }
    }
    let nodes: BTreeSet<N> = graph
        .iter()
        .flat_map(|(from, to)| std::iter::once(from).chain(to))
        .cloned()
        .collect();
    let mut seen = BTreeSet::new();
    let mut order = Vec::new();
    for node in &nodes {
        finish(graph, node, &mut seen, &mut order);
    }

    let mut reversed: Graph<N> = BTreeMap::new();
    for (from, targets) in graph {
        for to in targets {
            reversed.entry(to.clone()).or_default().insert(from.clone());
        }
    }
    let mut assigned = BTreeSet::new();
    let mut knots = Vec::new();
    for node in order.iter().rev() {
        let mut component = Vec::new();
        finish(&reversed, node, &mut assigned, &mut component);
        if component.len() > 1 {
            component.sort();
            knots.push(component);
        }
    }
    knots.sort();
    knots
}

/// One concrete circle inside a knot: the shortest way from its first node back to itself,
/// as `[a, b, …, a]` (breadth-first search).
fn circle_through<N: Ord + Clone>(graph: &Graph<N>, knot: &[N]) -> Vec<N> {
    let start = &knot[0];
    let mut came_from: BTreeMap<N, N> = BTreeMap::new();
    let mut queue = VecDeque::from([start.clone()]);
    while let Some(node) = queue.pop_front() {
        for next in graph.get(&node).into_iter().flatten() {
            if next == start {
                // Walk back from `node` to `start` (the one node with no predecessor here).
                let mut circle = vec![node.clone()];
                while let Some(previous) = came_from.get(circle.last().expect("never empty")) {
                    circle.push(previous.clone());
                }
                circle.reverse(); // start, …, node
                circle.push(start.clone());
                return circle;
            }
            if knot.contains(next) && !came_from.contains_key(next) {
                came_from.insert(next.clone(), node.clone());
                queue.push_back(next.clone());
            }
        }
    }
    unreachable!("every node of a knot lies on a circle")
}
