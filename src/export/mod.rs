//! From the sandbox to real scale: a run's config exported to TRL, verl or OpenRLHF (the
//! framework's config with every key explicit, a reward module, the prompt data and
//! `MAPPING.md`), and a run's logs exported to TensorBoard and UNIPO ([`logs`]).
//!
//! Everything here builds text in memory ([`Bundle`]); [`Bundle::write`] is the one place
//! that touches the file system. The framework versions are pinned ([`Framework::version`]);
//! the key sets the exports are checked against live in `tests/data/`.

pub mod logs;
pub mod plan;
pub mod reward_py;
pub mod value;

use crate::config::RunConfig;
use crate::task::sort::{PromptSet, sorted};
use plan::{Plan, Status};
use std::path::Path;
use value::Val;

/// A framework a run can be exported to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framework {
    Trl,
    Verl,
    OpenRlhf,
}

impl Framework {
    pub const ALL: [Framework; 3] = [Framework::Trl, Framework::Verl, Framework::OpenRlhf];
    pub const NAMES: &'static [&'static str] = &["trl", "verl", "openrlhf"];

    pub fn name(self) -> &'static str {
        match self {
            Framework::Trl => "trl",
            Framework::Verl => "verl",
            Framework::OpenRlhf => "openrlhf",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.name() == s)
    }
    /// The pinned version and the source file its keys come from.
    pub fn version(self) -> (&'static str, &'static str) {
        match self {
            Framework::Trl => (
                "TRL v1.9.0",
                "huggingface/trl trl/trainer/grpo_config.py (GRPOConfig) + transformers TrainingArguments",
            ),
            Framework::Verl => (
                "verl v0.7.0",
                "volcengine/verl verl/trainer/config/_generated_ppo_trainer.yaml (main_ppo)",
            ),
            Framework::OpenRlhf => (
                "OpenRLHF v0.11.0",
                "OpenRLHF/OpenRLHF openrlhf/cli/train_ppo_ray.py",
            ),
        }
    }
    /// The file holding the framework's config.
    pub fn config_file(self) -> &'static str {
        match self {
            Framework::Trl => "train_trl.py",
            Framework::Verl => "run_verl.sh",
            Framework::OpenRlhf => "run_openrlhf.sh",
        }
    }
    pub fn display(self) -> &'static str {
        match self {
            Framework::Trl => "TRL",
            Framework::Verl => "verl",
            Framework::OpenRlhf => "OpenRLHF",
        }
    }
}

/// How to export.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// The pretrained policy (a Hugging Face model id or a local path).
    pub model: String,
    /// Export keys without a counterpart with a warning instead of refusing.
    pub lenient: bool,
    /// The command that made the export (written at the top of each file).
    pub command: String,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            model: DEFAULT_MODEL.into(),
            lenient: false,
            command: String::new(),
        }
    }
}

/// A small instruct model that fits on one GPU.
pub const DEFAULT_MODEL: &str = "Qwen/Qwen2.5-0.5B-Instruct";

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(
        "cannot export to {framework}: {keys} {have} no counterpart there:\n{details}\n(--lenient exports anyway, with these listed in MAPPING.md)"
    )]
    NoCounterpart {
        framework: &'static str,
        keys: String,
        have: &'static str,
        details: String,
    },
    #[error("the prompt set: {0}")]
    Prompts(#[from] crate::task::sort::TaskError),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

/// The files of an export, in memory, and what it warns about.
#[derive(Debug, Clone)]
pub struct Bundle {
    pub framework: Framework,
    pub files: Vec<(String, String)>,
    /// One line per key carried approximately (or refused, under `--lenient`), by name.
    pub warnings: Vec<String>,
    pub plan: Plan,
}

impl Bundle {
    pub fn file(&self, name: &str) -> Option<&str> {
        self.files
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.as_str())
    }

    /// Write every file under `dir` (created).
    pub fn write(&self, dir: &Path) -> Result<(), ExportError> {
        for (name, text) in &self.files {
            let path = dir.join(name);
            let io = |source| ExportError::Io {
                path: path.display().to_string(),
                source,
            };
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(io)?;
            }
            std::fs::write(&path, text).map_err(io)?;
            #[cfg(unix)]
            if name.ends_with(".sh") {
                use std::os::unix::fs::PermissionsExt;
                let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755));
            }
        }
        Ok(())
    }
}

/// The prompt an LLM sees for a list of numbers.
pub fn prompt_text(numbers: &[u32]) -> String {
    format!(
        "Sort these numbers in non-decreasing order. Answer with the sorted numbers only, separated by single spaces.\nNumbers: {}\nSorted:",
        join(numbers)
    )
}

fn join(v: &[u32]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Export a config to a framework.
pub fn export(c: &RunConfig, fw: Framework, opts: &Options) -> Result<Bundle, ExportError> {
    let prompts = PromptSet::build(&c.task, c.run.seed)?;
    let plan = plan::plan(c, fw, opts, prompts.train.len(), prompts.heldout.len());
    let refused: Vec<&plan::Row> = plan.refused().collect();
    if !refused.is_empty() && !opts.lenient {
        let keys = refused
            .iter()
            .map(|r| format!("`{}`", r.key))
            .collect::<Vec<_>>()
            .join(", ");
        return Err(ExportError::NoCounterpart {
            framework: fw.display(),
            have: if refused.len() == 1 { "has" } else { "have" },
            keys,
            details: refused
                .iter()
                .map(|r| format!("  {} = {}: {}", r.key, r.ours, r.note))
                .collect::<Vec<_>>()
                .join("\n"),
        });
    }
    let mut warnings: Vec<String> = plan
        .rows
        .iter()
        .filter(|r| matches!(r.status, Status::Approx | Status::Refused))
        .map(|r| {
            format!(
                "{} = {}: {}{}",
                r.key,
                r.ours,
                if r.status == Status::Refused {
                    "NO COUNTERPART (exported under --lenient): "
                } else {
                    ""
                },
                r.note
            )
        })
        .collect();
    if let Some(r) = plan
        .rows
        .iter()
        .find(|r| r.key == "optimizer.lr" && !r.note.is_empty())
    {
        warnings.push(format!("optimizer.lr = {}: {}", r.ours, r.note));
    }
    warnings.push(format!(
        "model.*: grpo-lab's {} policy is replaced by the pretrained {}",
        c.kind_name(),
        opts.model
    ));
    let header = header(c, fw, opts);
    let mut files = vec![
        (
            fw.config_file().to_string(),
            config_file(fw, &plan, &header),
        ),
        ("reward.py".to_string(), reward_py::module(c, &header)),
        (
            "reward_cases.json".to_string(),
            serde_json::to_string_pretty(&reward_py::cases(c)).expect("cases serialize") + "\n",
        ),
        (
            "data/train.jsonl".to_string(),
            jsonl(&prompts.train, "train"),
        ),
        (
            "data/heldout.jsonl".to_string(),
            jsonl(&prompts.heldout, "heldout"),
        ),
        ("grpo-lab.toml".to_string(), c.to_toml()),
        ("MAPPING.md".to_string(), mapping_md(c, fw, &plan, opts)),
    ];
    if fw == Framework::Verl {
        files.push(("data/make_parquet.py".to_string(), parquet_script(&header)));
    }
    Ok(Bundle {
        framework: fw,
        files,
        warnings,
        plan,
    })
}

impl crate::config::RunConfig {
    fn kind_name(&self) -> &'static str {
        match self.model.kind {
            crate::config::ModelKind::Lecture => "lecture",
            crate::config::ModelKind::Transformer => "transformer",
        }
    }
}

fn header(c: &RunConfig, fw: Framework, opts: &Options) -> String {
    let (version, source) = fw.version();
    let cmd = if opts.command.is_empty() {
        String::new()
    } else {
        format!("; made by `{}`", opts.command)
    };
    let line = format!(
        "grpo-lab {} export of run `{}` for {version} (keys from {source}){cmd}",
        env!("CARGO_PKG_VERSION"),
        c.run.name
    );
    // A comment line in every file: a line break in the command (an argument's) would end the
    // comment and run the rest as code.
    line.chars()
        .flat_map(|c| match c.is_control() {
            true => c.escape_default().collect(),
            false => vec![c],
        })
        .collect()
}

/// The data files: one JSON object per prompt.
fn jsonl(prompts: &[Vec<u32>], split: &str) -> String {
    let mut out = String::new();
    for (index, p) in prompts.iter().enumerate() {
        let row = serde_json::json!({
            "prompt": prompt_text(p),
            "numbers": p,
            "ground_truth": join(&sorted(p)),
            "data_source": "grpo-lab/sort",
            "split": split,
            "index": index,
        });
        out.push_str(&row.to_string());
        out.push('\n');
    }
    out
}

fn parquet_script(header: &str) -> String {
    format!(
        r#"# {header}
"""Write verl's parquet rows from data/train.jsonl and data/heldout.jsonl.

verl's RL dataset reads `prompt` (chat messages), `data_source`, `reward_model.ground_truth`
(passed to compute_score) and `extra_info`. Needs pandas and pyarrow:
    python3 data/make_parquet.py
"""
import json
import os

import pandas as pd

HERE = os.path.dirname(os.path.abspath(__file__))


def rows(split):
    with open(os.path.join(HERE, split + ".jsonl")) as f:
        for line in f:
            r = json.loads(line)
            yield {{
                "data_source": r["data_source"],
                "prompt": [{{"role": "user", "content": r["prompt"]}}],
                "ability": "sorting",
                "reward_model": {{"style": "rule", "ground_truth": r["ground_truth"]}},
                "extra_info": {{"split": r["split"], "index": r["index"], "numbers": r["numbers"]}},
            }}


for split in ("train", "heldout"):
    frame = pd.DataFrame(list(rows(split)))
    frame.to_parquet(os.path.join(HERE, split + ".parquet"))
    print(split, len(frame), "rows")
"#
    )
}

fn config_file(fw: Framework, plan: &Plan, header: &str) -> String {
    let settings = plan.settings();
    match fw {
        Framework::Trl => trl_script(plan, &settings, header),
        Framework::Verl => verl_script(&settings, header),
        Framework::OpenRlhf => openrlhf_script(&settings, header),
    }
}

/// The grpo-lab key a framework key comes from ("pinned" where none does).
fn source_of(plan: &Plan, key: &str) -> String {
    plan.rows
        .iter()
        .find(|r| r.theirs.iter().any(|(k, _)| k == key))
        .map(|r| r.key.to_string())
        .or_else(|| {
            plan.pinned
                .iter()
                .find(|p| p.key == key)
                .map(|_| "pinned".into())
        })
        .unwrap_or_default()
}

/// `train_trl.py`: a `GRPOConfig` with every setting, then the trainer.
fn trl_script(plan: &Plan, settings: &[(String, Val)], header: &str) -> String {
    let mut out = format!(
        r#"# {header}
# Every GRPOConfig key that decides the algorithm is written out; MAPPING.md says where each
# comes from. Run: python3 train_trl.py  (pip install "trl==1.9.0" datasets)
# It runs as written on a machine without a GPU too (fp32 there). A first check, on a small
# local model and without a download: python3 train_trl.py --model DIR --max-steps 2
import argparse
import importlib.util
import json
import os

import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

import reward

MODEL = {model}
HERE = os.path.dirname(os.path.abspath(__file__))
# Decided where the script runs: bf16 where the GPU supports it, else fp32 (grpo-lab computes
# in f32); TensorBoard logs where tensorboard is installed.
BF16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
REPORT_TO = ["tensorboard"] if importlib.util.find_spec("tensorboard") else "none"


def load(path):
    with open(os.path.join(HERE, path)) as f:
        return Dataset.from_list([json.loads(line) for line in f])


config = GRPOConfig(
"#,
        model = Val::str(plan_model(plan)).python()
    );
    for (k, v) in settings {
        out.push_str(&format!(
            "    {k}={},  # {}\n",
            v.python(),
            source_of(plan, k)
        ));
    }
    out.push_str(
        r#")

if __name__ == "__main__":
    cli = argparse.ArgumentParser(description="GRPO in TRL, as the grpo-lab run")
    cli.add_argument("--model", default=MODEL, help="a hub name or a local directory")
    cli.add_argument("--max-steps", type=int, default=config.max_steps,
                     help="stop after this many optimizer steps")
    cli.add_argument("--output-dir", default=config.output_dir)
    args = cli.parse_args()
    # As GRPOConfig's own __post_init__ would have taken them.
    config.max_steps, config.output_dir = args.max_steps, os.path.expanduser(args.output_dir)
    assert config.reward_weights == reward.REWARD_WEIGHTS, "reward.py and the config disagree"
    trainer = GRPOTrainer(
        model=args.model,
        reward_funcs=reward.REWARD_FUNCS,
        args=config,
        train_dataset=load("data/train.jsonl"),
    )
    trainer.train()
"#,
    );
    out
}

/// `run_verl.sh`: `main_ppo` with every setting as a Hydra override.
fn verl_script(settings: &[(String, Val)], header: &str) -> String {
    let mut out = format!(
        "#!/usr/bin/env bash\n# {header}\n# Every main_ppo key that decides the algorithm is written out; MAPPING.md says where each\n# comes from. Run: python3 data/make_parquet.py && bash run_verl.sh  (pip install \"verl==0.7.0\")\nset -euo pipefail\ncd \"$(dirname \"$0\")\"\npython3 -m verl.trainer.main_ppo \\\n"
    );
    for (k, v) in settings {
        out.push_str(&format!(
            "    {} \\\n",
            shell_word(&format!("{k}={}", v.hydra()))
        ));
    }
    out.push_str("    \"$@\"\n");
    out
}

/// `word` as one bash word: as it is where every character is plain, else single-quoted (a `'`
/// inside as `'\''`) — a Hydra value's own quotes, `$`, globs and braces reach Hydra as written.
fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./:=,+@%".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_string()
    } else {
        value::single_quoted(word)
    }
}

/// `run_openrlhf.sh`: `train_ppo_ray` with every setting as a flag (off switches as comments).
fn openrlhf_script(settings: &[(String, Val)], header: &str) -> String {
    let mut out = format!(
        "#!/usr/bin/env bash\n# {header}\n# Every train_ppo_ray flag that decides the algorithm is written out; MAPPING.md says where\n# each comes from. store_true flags that are off and flags left at None are listed as\n# comments (argparse cannot take `false` or `None`). Run inside a Ray cluster:\n#   ray start --head && bash run_openrlhf.sh   (pip install \"openrlhf==0.11.0\")\nset -euo pipefail\ncd \"$(dirname \"$0\")\"\n"
    );
    let mut off = Vec::new();
    let mut args = Vec::new();
    for (k, v) in settings {
        match v {
            Val::Bool(true) => args.push(format!("--{k}")),
            Val::Bool(false) => off.push(format!("#   --{k}  (store_true, off)")),
            Val::None => off.push(format!("#   --{k}  (None)")),
            v => args.push(format!("--{k} {}", v.cli())),
        }
    }
    if !off.is_empty() {
        out.push_str("# Written as off:\n");
        for line in &off {
            out.push_str(line);
            out.push('\n');
        }
    }
    out.push_str("python3 -m openrlhf.cli.train_ppo_ray \\\n");
    for a in &args {
        out.push_str(&format!("    {a} \\\n"));
    }
    out.push_str("    \"$@\"\n");
    out
}

/// The variables of the TRL script that a setting may name ([`Val::Expr`]): decided where the
/// script runs.
pub const TRL_RUNTIME: &[&str] = &["BF16", "REPORT_TO"];

fn plan_model(plan: &Plan) -> String {
    plan.rows
        .iter()
        .find(|r| r.key == "model.kind")
        .and_then(|r| r.note.strip_prefix("the policy is the pretrained "))
        .unwrap_or(DEFAULT_MODEL)
        .to_string()
}

/// Read the settings back from a written config file (TRL's `GRPOConfig(...)`, verl's
/// overrides, OpenRLHF's flags with the off ones from their comments).
pub fn parse_written(fw: Framework, text: &str) -> Vec<(String, Val)> {
    let mut out = Vec::new();
    match fw {
        Framework::Trl => {
            let body = text
                .split_once("config = GRPOConfig(\n")
                .map(|(_, b)| b)
                .unwrap_or("");
            for line in body.lines() {
                if line.starts_with(')') {
                    break;
                }
                let line = line.split("  # ").next().unwrap_or("").trim();
                let line = line.strip_suffix(',').unwrap_or(line);
                if let Some((k, v)) = line.split_once('=')
                    && let Some(v) = Val::parse_python(v, TRL_RUNTIME)
                {
                    out.push((k.to_string(), v));
                }
            }
        }
        Framework::Verl => {
            for line in text.lines() {
                let Some(l) = line.strip_suffix(" \\") else {
                    continue;
                };
                let word = shell_words(l.trim()).into_iter().next().map(|w| w.0);
                if let Some((k, v)) = word.as_deref().and_then(|w| w.split_once('='))
                    && let Some(v) = Val::parse_literal(v)
                {
                    out.push((k.to_string(), v));
                }
            }
        }
        Framework::OpenRlhf => {
            for line in text.lines() {
                if let Some(rest) = line.strip_prefix("#   --") {
                    let (k, why) = rest.split_once("  (").unwrap_or((rest, ""));
                    let v = if why.starts_with("None") {
                        Val::None
                    } else {
                        Val::Bool(false)
                    };
                    out.push((k.to_string(), v));
                    continue;
                }
                let Some(l) = line.trim().strip_suffix(" \\") else {
                    continue;
                };
                let Some(flag) = l.strip_prefix("--") else {
                    continue;
                };
                let words = shell_words(flag);
                let k = words.first().map(|w| w.0.clone()).unwrap_or_default();
                let rest = &words[words.len().min(1)..];
                let v = match rest.len() {
                    0 => Val::Bool(true),
                    1 => parse_word(&rest[0]),
                    _ => Val::List(rest.iter().map(parse_word).collect()),
                };
                out.push((k, v));
            }
        }
    }
    out
}

/// A command line's words as bash splits them (single quotes and `\'`), each with whether
/// any part of it was quoted: what [`Val::cli`] and [`shell_word`] wrote.
fn shell_words(line: &str) -> Vec<(String, bool)> {
    let (mut words, mut word, mut quoted, mut inside) = (vec![], None::<String>, false, false);
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                inside = !inside;
                quoted = true;
                word.get_or_insert_with(String::new);
            }
            '\\' if !inside => word.get_or_insert_with(String::new).extend(chars.next()),
            ' ' if !inside => {
                if let Some(w) = word.take() {
                    words.push((w, quoted));
                }
                quoted = false;
            }
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word.map(|w| (w, quoted)));
    words
}

/// A word of [`shell_words`] as a value: a quoted one is a string as written.
fn parse_word((w, quoted): &(String, bool)) -> Val {
    if *quoted {
        return Val::Str(w.clone());
    }
    let w = w.as_str();
    match Val::parse_literal(w) {
        Some(Val::Bool(b)) => Val::Str(b.to_string()),
        Some(Val::None) => Val::Str(w.to_string()),
        Some(v) => v,
        None => Val::Str(w.to_string()),
    }
}

fn mapping_md(c: &RunConfig, fw: Framework, plan: &Plan, opts: &Options) -> String {
    let (version, source) = fw.version();
    let s = &plan.shape;
    let cell = |t: &str| t.replace('|', "\\|").replace('\n', " ");
    let mut out = format!(
        "# grpo-lab `{name}` → {version}\n\n\
         Keys from {source}. Policy: `{model}` (grpo-lab's own model is replaced). \
         Config file: `{file}`; reward: `reward.py`; data: `data/`. The exact grpo-lab config is \
         `grpo-lab.toml`.{cmd}\n\n",
        name = c.run.name,
        model = opts.model,
        file = fw.config_file(),
        cmd = if opts.command.is_empty() {
            String::new()
        } else {
            format!("\n\nMade by: `{}`", opts.command)
        },
    );
    out.push_str("## Batch arithmetic\n\n");
    out.push_str(&format!(
        "grpo-lab: P = {} training prompts, H = {} held-out; each iteration samples G = {} answers for each of B = {} prompts ({} answers) and takes μ = {} optimizer steps on that whole batch; {} iterations = {} optimizer steps.\n\n",
        s.p,
        s.h,
        s.g,
        s.b,
        s.b * s.g,
        s.mu,
        s.iterations,
        s.iterations * s.mu
    ));
    for key in [
        "algorithm.prompts_per_iteration",
        "algorithm.mu",
        "run.iterations",
    ] {
        if let Some(r) = plan.rows.iter().find(|r| r.key == key) {
            let settings = r
                .theirs
                .iter()
                .map(|(k, v)| format!("`{k}={}`", v.hydra()))
                .collect::<Vec<_>>()
                .join(", ");
            out.push_str(&format!("- {settings}: {}\n", r.note));
        }
    }
    out.push_str("\n## Every grpo-lab key\n\n| grpo-lab key | value | → framework key = value | carried | note |\n|---|---|---|---|---|\n");
    for r in &plan.rows {
        let theirs = if r.theirs.is_empty() {
            "—".to_string()
        } else {
            r.theirs
                .iter()
                .map(|(k, v)| format!("`{k}` = `{}`", v.hydra()))
                .collect::<Vec<_>>()
                .join("<br>")
        };
        out.push_str(&format!(
            "| `{}` | `{}` | {} | {} | {} |\n",
            r.key,
            cell(&r.ours),
            cell(&theirs),
            r.status.word(),
            cell(&r.note)
        ));
    }
    out.push_str(&not_exact_md(c, fw, plan, opts));
    out.push_str(&format!(
        "\n## {} keys grpo-lab has no key for (pinned)\n\n| key | value | why |\n|---|---|---|\n",
        fw.display()
    ));
    for p in &plan.pinned {
        out.push_str(&format!(
            "| `{}` | `{}` | {} |\n",
            p.key,
            p.val.hydra(),
            cell(&p.why)
        ));
    }
    out.push_str("\n## Checking the reward\n\n`python3 -m doctest reward.py -v` runs the worked values of GRPO-SPEC §1 and the text-parsing cases (`reward_cases.json`, computed by grpo-lab's own verifiers); `grpo-lab score --reward distance --prompt 3,1,0,2 --response 0,3,1,2` gives the same numbers.\n");
    out
}

/// The mapping's "Not exact" section: every approximate or refused key and every pinned key
/// that differs, with both values.
fn not_exact_md(c: &RunConfig, fw: Framework, plan: &Plan, opts: &Options) -> String {
    let mut out = String::new();
    out.push_str("\n## Not exact (both values)\n\n");
    let mut any = false;
    for r in plan
        .rows
        .iter()
        .filter(|r| matches!(r.status, Status::Approx | Status::Refused))
    {
        any = true;
        out.push_str(&format!(
            "- **`{}`** = `{}`{}: {}\n",
            r.key,
            r.ours,
            if r.status == Status::Refused {
                " (no counterpart; exported under --lenient)"
            } else {
                ""
            },
            r.note
        ));
    }
    for p in plan.pinned.iter().filter(|p| p.differs) {
        any = true;
        out.push_str(&format!(
            "- **`{}`** = `{}` ({}): {}\n",
            p.key,
            p.val.hydra(),
            fw.display(),
            p.why
        ));
    }
    out.push_str(&format!(
        "- **the policy**: grpo-lab's {} model (a few hundred parameters, its own tokenizer) → `{}`; answer lengths are counted in different tokens (task.max_len)\n",
        c.kind_name(),
        opts.model
    ));
    if !any {
        out.push_str("- nothing else\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kl_beta_winner() -> RunConfig {
        RunConfig::preset("lecture17")
            .unwrap()
            .with_overrides(&[
                "model.init_scale=0.3".into(),
                "optimizer.lr=0.01".into(),
                "algorithm.loss=clipped".into(),
                "algorithm.epsilon_low=0.2".into(),
                "algorithm.epsilon_high=0.2".into(),
                "algorithm.beta=0.04".into(),
            ])
            .unwrap()
    }

    #[test]
    fn every_key_of_the_field_table_has_an_export_rule() {
        for fw in Framework::ALL {
            for preset in ["lecture17", "transformer-sort", "random-sort"] {
                let c = RunConfig::preset(preset).unwrap();
                let plan = plan::plan(&c, fw, &Options::default(), 3, 32);
                assert_eq!(plan.rows.len(), crate::config::FIELDS.len());
                for r in &plan.rows {
                    assert_ne!(
                        r.note,
                        "no export rule for this key yet",
                        "{}: {}",
                        fw.name(),
                        r.key
                    );
                }
            }
        }
    }

    #[test]
    fn a_key_written_twice_gets_one_value() {
        for fw in Framework::ALL {
            let plan = plan::plan(&kl_beta_winner(), fw, &Options::default(), 3, 32);
            let mut all: Vec<(String, Val)> = plan
                .rows
                .iter()
                .flat_map(|r| r.theirs.clone())
                .chain(plan.pinned.iter().map(|p| (p.key.clone(), p.val.clone())))
                .collect();
            all.sort_by(|a, b| a.0.cmp(&b.0));
            for w in all.windows(2) {
                if w[0].0 == w[1].0 {
                    assert_eq!(w[0].1, w[1].1, "{}: {}", fw.name(), w[0].0);
                }
            }
        }
    }

    #[test]
    fn the_winner_exports_to_all_three_and_naive_mu_10_is_refused_by_name() {
        let c = kl_beta_winner();
        for fw in Framework::ALL {
            let b = export(&c, fw, &Options::default()).unwrap();
            assert!(b.file(fw.config_file()).is_some());
            assert!(b.file("MAPPING.md").unwrap().contains("algorithm.beta"));
        }
        let lecture = RunConfig::preset("lecture17").unwrap();
        let e = export(&lecture, Framework::Trl, &Options::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("`algorithm.loss`") && e.contains("naive"), "{e}");
        let lenient = Options {
            lenient: true,
            ..Options::default()
        };
        let b = export(&lecture, Framework::Trl, &lenient).unwrap();
        assert!(b.warnings.iter().any(|w| w.starts_with("algorithm.loss")));
    }

    #[test]
    fn text_answers_parse_as_the_tokenizer_reads_them() {
        let tok = crate::task::SortTokenizer::load().unwrap();
        for text in ["3 1 0 2", " 10  1023 0\t7", "", "999"] {
            assert_eq!(
                reward_py::parse_answer(text).0,
                tok.encode(text).unwrap(),
                "{text:?}"
            );
        }
        use crate::task::tokenizer::{EOS_ID, UNK_ID};
        assert_eq!(
            reward_py::parse_answer("1 x 007 -1 1024 <eos> 3"),
            (vec![1, UNK_ID, UNK_ID, UNK_ID, UNK_ID], true)
        );
        assert_eq!(tok.decode(&[1, EOS_ID]), "1 <eos>");
    }

    #[test]
    fn the_reward_cases_are_the_spec_worked_values() {
        let c = RunConfig::preset("lecture17").unwrap();
        let cases = reward_py::cases(&c);
        let get = |a: &str| cases.iter().find(|k| k.answer == a).unwrap();
        let v = |k: &reward_py::Case| (k.distance, k.inclusion_ordering, k.exact);
        // GRPO-SPEC §1, prompt [3,1,0,2].
        assert_eq!(v(get("0 1 2 3")), (4, 7, 1));
        assert_eq!(v(get("7 2 2 5")), (1, 3, 0));
        assert_eq!(v(get("0 3 1 2")), (1, 6, 0));
        // The answer ends at <eos>; "0," is no number: <unk> (id 1026) sorts after every number.
        assert_eq!(v(get("  0 1\n2 3 <eos> 9 9")), (4, 7, 1));
        assert_eq!(v(get("0, 1, 2, 3")), (1, 3, 0));
        // lecture17's reward is inclusion_ordering alone.
        assert_eq!(get("0 1 2 3").score, "7.0000");
        // Every case agrees with `grpo-lab score`'s function.
        for k in &cases {
            for (kind, val) in [
                (crate::config::RewardKind::Distance, k.distance),
                (
                    crate::config::RewardKind::InclusionOrdering,
                    k.inclusion_ordering,
                ),
                (crate::config::RewardKind::Exact, k.exact),
            ] {
                let r = crate::task::RewardFn::single(kind).score(&k.prompt, &k.tokens);
                assert_eq!(r.reward, val as f32, "{k:?}");
            }
        }
        // And the module's doctests carry every case.
        let py = reward_py::module(&c, "test");
        for k in &cases {
            let answer = serde_json::to_string(&k.answer).unwrap();
            assert!(
                py.contains(&format!(
                    ">>> verifiers({:?}, {answer})\n    ({}, {}, {})",
                    k.prompt, k.distance, k.inclusion_ordering, k.exact
                )),
                "{k:?}"
            );
            assert!(py.contains(&format!("'{}'", k.score)));
        }
    }

    #[test]
    fn weighted_rewards_reach_the_module_and_the_trl_config() {
        let c = RunConfig::preset("random-sort")
            .unwrap()
            .with_overrides(&["task.reward_weights={ exact = 1.0, distance = 0.25 }".into()])
            .unwrap();
        let b = export(&c, Framework::Trl, &Options::default()).unwrap();
        let py = b.file("reward.py").unwrap();
        assert!(py.contains(
            "WEIGHTS = {\"distance\": 0.25, \"inclusion_ordering\": 0.0, \"exact\": 1.0}"
        ));
        let trl = b.file("train_trl.py").unwrap();
        assert!(trl.contains("reward_weights=[0.25, 0.0, 1.0],"), "{trl}");
        let cases = reward_py::cases(&c);
        let k = cases.iter().find(|k| k.answer == "7 2 2 5").unwrap();
        // 0.25 · distance 1 + exact 0.
        assert_eq!(k.score, "0.2500");
    }
}
