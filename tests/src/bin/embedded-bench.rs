//! Decode speed of the embedded backend: loads the GGUF model in-process (as a node does) and
//! greedy-decodes TOKENS tokens from a fixed prompt RUNS times, end-of-generation ignored,
//! timing only the single-token decode steps (what llama.cpp's `llama-bench` calls `tg`). Also
//! prints the load time, the speed the node measured at load, and one real chat answer with
//! its end-to-end rate (prompt processing and streaming included).
//!
//! Run: `cargo build --release --bins && target/release/embedded-bench [TOKENS] [THREADS] [RUNS]`
//! (defaults 64, 2, 10). The model is `MESH_EMBEDDED_MODEL` or the file deploy/fetch-model.sh
//! puts into the default data dir.

use std::{path::PathBuf, process::ExitCode, time::Instant};

use anyhow::{Context, bail};
use mesh_domain::{ChatRequest, Message, Role};
use mesh_node::testing::{ChatModel, EmbeddedModel, EmbeddedOptions};

fn main() -> ExitCode {
    let arg = mesh_tests::arg;
    match bench(arg(1, 64), arg(2, 2), arg(3, 10)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn model_path() -> anyhow::Result<PathBuf> {
    let path = match std::env::var_os("MESH_EMBEDDED_MODEL") {
        Some(path) => PathBuf::from(path),
        None => mesh_node::config::default_model_path(
            &mesh_join::bootstrap::default_data_dir().context("no default data dir")?,
        ),
    };
    if !path.is_file() {
        bail!(
            "no model at {}: run deploy/fetch-model.sh, or set MESH_EMBEDDED_MODEL",
            path.display()
        );
    }
    Ok(path)
}

fn bench(tokens: usize, threads: usize, runs: usize) -> anyhow::Result<()> {
    let path = model_path()?;
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let started = Instant::now();
        let model = EmbeddedModel::start(
            "bench",
            EmbeddedOptions {
                path: path.clone(),
                threads,
                context_window: 2048,
                timeout: std::time::Duration::from_secs(600),
                embeddings: false,
            },
        );
        model.ready().await?;
        let loaded = started.elapsed();
        // The first measurement after load is the node's own; wait for it through a no-op run.
        let _ = model.measure_decode(1).await?;
        println!("model:   {}", path.display());
        println!(
            "threads: {threads}, cores: {}, tokens per run: {tokens}, runs: {runs}",
            mesh_node::config::default_threads()
        );
        println!("load:    {:.0} ms", loaded.as_secs_f64() * 1000.0);
        println!(
            "at load: {:.1} tok/s (the node's measurement, {} tokens)",
            model.tokens_per_s().unwrap_or(0.0),
            mesh_node::testing::MEASURE_TOKENS
        );
        let mut rates = Vec::with_capacity(runs);
        for run in 1..=runs {
            let speed = model.measure_decode(tokens).await?;
            let rate = speed.tokens_per_s().unwrap_or(0.0);
            println!(
                "run {run:>2}:  {:.1} tok/s ({} tokens in {:.1} ms)",
                rate,
                speed.tokens,
                speed.elapsed.as_secs_f64() * 1000.0
            );
            rates.push(rate);
        }
        rates.sort_by(f64::total_cmp);
        if let (Some(min), Some(max)) = (rates.first(), rates.last()) {
            println!(
                "decode:  median {:.1} tok/s, min {min:.1}, max {max:.1}",
                rates[rates.len() / 2]
            );
        }

        // Nobody reads the text (the receiver is dropped): the engine does not wait for a reader.
        let (tx, _) = mesh_node::testing::delta_channel();
        let request = ChatRequest {
            messages: vec![Message::text(
                Role::User,
                "What is the capital of France? Answer in one word.",
            )],
            tools: Vec::new(),
            ..Default::default()
        };
        let started = Instant::now();
        let answer = model.chat(&request, &tx).await?;
        let elapsed = started.elapsed();
        let usage = answer.usage.unwrap_or_default();
        println!(
            "chat:    {:?} in {:.0} ms ({} prompt + {} completion tokens, {:.1} tok/s end to end)",
            answer.content,
            elapsed.as_secs_f64() * 1000.0,
            usage.prompt_tokens,
            usage.completion_tokens,
            usage.completion_tokens as f64 / elapsed.as_secs_f64()
        );
        Ok(())
    })
}
