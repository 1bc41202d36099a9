//! `grpo-lab export` and `export-log`: the written configs hold only real keys of the pinned
//! framework versions (tests/data), read back to the same values, and the event files decode.

mod common;

use common::temp_dir;
use grpo_lab::config::RunConfig;
use grpo_lab::export::{self, Framework, Options, logs, value::Val};
use std::process::Command;

fn grpo_lab(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_grpo-lab"))
        .args(args)
        .output()
        .unwrap()
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The key list of a framework's pinned version (`#` lines name the version and the source).
fn real_keys(fw: Framework) -> Vec<String> {
    let text = match fw {
        Framework::Trl => include_str!("data/trl-1.9.0-grpo-config-keys.txt"),
        Framework::Verl => include_str!("data/verl-0.7.0-main-ppo-keys.txt"),
        Framework::OpenRlhf => include_str!("data/openrlhf-0.11.0-train-ppo-ray-flags.txt"),
    };
    let (version, _) = fw.version();
    let first = text.lines().next().unwrap();
    assert!(
        first.contains(version.split(' ').nth(1).unwrap()),
        "{first} should name {version}"
    );
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.trim().to_string())
        .collect()
}

const WINNER: [&str; 6] = [
    "model.init_scale=0.3",
    "optimizer.lr=0.01",
    "algorithm.loss=clipped",
    "algorithm.epsilon_low=0.2",
    "algorithm.epsilon_high=0.2",
    "algorithm.beta=0.04",
];

/// Configs that between them touch every mapping rule.
fn configs() -> Vec<RunConfig> {
    let winner = RunConfig::preset("lecture17")
        .unwrap()
        .with_overrides(&WINNER.map(String::from))
        .unwrap();
    let mut out = vec![winner.clone()];
    for sets in [
        vec![
            "algorithm.advantage=centered",
            "algorithm.loss_agg_mode=seq-mean-token-sum-norm",
        ],
        vec![
            "algorithm.advantage=rloo",
            "algorithm.kl_estimator=k2",
            "algorithm.kl_penalty=reward",
        ],
        vec![
            "algorithm.advantage=batch_normalized",
            "sampling.top_k=3",
            "optimizer.max_grad_norm=1.0",
        ],
        vec![
            "algorithm.dynamic_sampling=true",
            "algorithm.loss_agg_mode=token-mean",
            "algorithm.epsilon_high=0.28",
        ],
    ] {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        out.push(winner.with_overrides(&sets).unwrap());
    }
    for preset in [
        "transformer-sort",
        "random-sort",
        "r1-vs-r1-zero",
        "length-bias",
    ] {
        out.push(RunConfig::preset(preset).unwrap());
    }
    out
}

fn lenient() -> Options {
    Options {
        lenient: true,
        ..Options::default()
    }
}

#[test]
fn exported_keys_are_real_keys_of_the_pinned_versions() {
    for fw in Framework::ALL {
        let real = real_keys(fw);
        for c in configs() {
            let b = export::export(&c, fw, &lenient()).unwrap();
            for (key, _) in b.plan.settings() {
                assert!(
                    real.contains(&key),
                    "{} {}: `{key}` is not a key of {}",
                    fw.name(),
                    c.run.name,
                    fw.version().0
                );
            }
        }
    }
}

#[test]
fn the_written_config_reads_back_to_the_same_values() {
    for fw in Framework::ALL {
        for c in configs() {
            let b = export::export(&c, fw, &lenient()).unwrap();
            let written = export::parse_written(fw, b.file(fw.config_file()).unwrap());
            let mut expected = b.plan.settings();
            let mut got = written.clone();
            expected.sort_by(|a, b| a.0.cmp(&b.0));
            got.sort_by(|a, b| a.0.cmp(&b.0));
            assert_eq!(got, expected, "{} {}", fw.name(), c.run.name);
        }
    }
}

/// A config with a supervised cold start says to run the framework's own SFT trainer first
/// (the verl and OpenRLHF bundles named TRL's).
#[test]
fn the_cold_start_names_each_frameworks_own_sft_trainer() {
    let c = RunConfig::preset("transformer-sort").unwrap();
    assert!(c.sft.steps > 0);
    for (fw, trainer) in [
        (Framework::Trl, "TRL's SFTTrainer"),
        (Framework::Verl, "verl.trainer.fsdp_sft_trainer"),
        (Framework::OpenRlhf, "openrlhf.cli.train_sft"),
    ] {
        let b = export::export(&c, fw, &lenient()).unwrap();
        let row = b.plan.rows.iter().find(|r| r.key == "sft.steps").unwrap();
        assert!(row.note.contains(trainer), "{}: {}", fw.name(), row.note);
        let mapping = b.file("MAPPING.md").unwrap();
        assert!(mapping.contains(trainer), "{}: MAPPING.md", fw.name());
        if fw != Framework::Trl {
            assert!(!mapping.contains("SFTTrainer"), "{}: MAPPING.md", fw.name());
        }
    }
}

/// The clipped loss's note speaks of TRL's naming only in TRL's bundle.
#[test]
fn the_clipped_loss_note_is_each_frameworks_own() {
    let c = RunConfig::preset("transformer-sort").unwrap();
    for fw in Framework::ALL {
        let b = export::export(&c, fw, &lenient()).unwrap();
        let row = b
            .plan
            .rows
            .iter()
            .find(|r| r.key == "algorithm.loss")
            .unwrap();
        assert!(
            row.note.starts_with("PPO's clipped objective"),
            "{}",
            row.note
        );
        assert_eq!(
            row.note.contains("TRL"),
            fw == Framework::Trl,
            "{}: {}",
            fw.name(),
            row.note
        );
    }
}

/// Notes that held for one framework only, checked where each framework reaches them: the
/// mapping status and what the note names.
#[test]
fn each_frameworks_notes_describe_that_framework() {
    let row = |sets: &[&str], fw: Framework, key: &str| {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        let c = RunConfig::preset("transformer-sort")
            .unwrap()
            .with_overrides(&sets)
            .unwrap();
        let b = export::export(&c, fw, &lenient()).unwrap();
        let r = b.plan.rows.iter().find(|r| r.key == key).unwrap().clone();
        (format!("{:?}", r.status), r.note)
    };
    let gspo = [
        "algorithm.importance_sampling_level=sequence",
        "algorithm.loss_agg_mode=seq-mean-token-mean",
    ];
    // OpenRLHF's gspo is GSPO's own sequence ratio, aggregated per sequence.
    let (_, note) = row(
        &gspo,
        Framework::OpenRlhf,
        "algorithm.importance_sampling_level",
    );
    assert!(
        note.contains("OpenRLHF's gspo") && !note.contains("GSPO-token"),
        "{note}"
    );
    let (_, note) = row(
        &gspo,
        Framework::Verl,
        "algorithm.importance_sampling_level",
    );
    assert!(note.contains("GSPO-token"), "{note}");
    let seq = [
        "algorithm.importance_sampling_level=sequence",
        "algorithm.loss_agg_mode=seq-mean-token-mean",
    ];
    let (status, note) = row(&seq, Framework::OpenRlhf, "algorithm.loss_agg_mode");
    assert_eq!(status, "Exact", "{note}");
    let luspo = [
        "algorithm.importance_sampling_level=sequence",
        "algorithm.loss_agg_mode=luspo",
    ];
    let (status, note) = row(&luspo, Framework::OpenRlhf, "algorithm.loss_agg_mode");
    assert!(
        status == "Approx" && note.contains("seq-mean-token-mean"),
        "{status}: {note}"
    );
    // verl's CISPO clips below at 1 − clip_ratio_low: the written ε_low is not inert there.
    let cispo = ["algorithm.loss=cispo"];
    let (status, note) = row(&cispo, Framework::Verl, "algorithm.epsilon_low");
    assert_eq!(status, "Approx", "{note}");
    let (status, _) = row(&cispo, Framework::Trl, "algorithm.epsilon_low");
    assert_eq!(status, "Inert");
    // verl's clip_ratio_c acts in its vanilla loss only.
    let (status, _) = row(
        &["algorithm.dual_clip=3"],
        Framework::Verl,
        "algorithm.dual_clip",
    );
    assert_eq!(status, "Exact");
    let dual_gspo = [
        "algorithm.dual_clip=3",
        "algorithm.importance_sampling_level=sequence",
        "algorithm.loss_agg_mode=seq-mean-token-mean",
    ];
    let (status, note) = row(&dual_gspo, Framework::Verl, "algorithm.dual_clip");
    assert!(
        status == "Refused" && note.contains("vanilla"),
        "{status}: {note}"
    );
    // verl's kl_cov is the unclipped loss: no refusal for μ > 1.
    let kl_cov = ["algorithm.cov_penalty=kl_cov", "algorithm.loss=unclipped"];
    let (status, note) = row(&kl_cov, Framework::Verl, "algorithm.loss");
    assert!(
        status == "Exact" && note.contains("kl_cov"),
        "{status}: {note}"
    );
    // OpenRLHF shuffles its mini-batches as TRL does; verl keeps them in order.
    let mini = ["algorithm.steps_per_generation=2"];
    let (status, note) = row(&mini, Framework::OpenRlhf, "algorithm.steps_per_generation");
    assert!(
        status == "Approx" && note.contains("OpenRLHF shuffles"),
        "{status}: {note}"
    );
    let (status, _) = row(&mini, Framework::Verl, "algorithm.steps_per_generation");
    assert_eq!(status, "Exact");
    // Only OpenRLHF has the dynamic-sampling filter that max_resample_rounds bounds.
    for (fw, want) in [
        (Framework::Trl, "Inert"),
        (Framework::Verl, "Inert"),
        (Framework::OpenRlhf, "Approx"),
    ] {
        let (status, _) = row(&[], fw, "algorithm.max_resample_rounds");
        assert_eq!(status, want, "{}", fw.name());
    }
    // The critic's keys are each framework's own.
    let gae = ["algorithm.advantage=gae"];
    let (_, note) = row(&gae, Framework::OpenRlhf, "algorithm.value_hidden");
    assert!(note.contains("critic.model_name_or_path"), "{note}");
    let (_, note) = row(&gae, Framework::Verl, "algorithm.value_hidden");
    assert!(note.contains("critic.model.path"), "{note}");
    let (_, note) = row(&gae, Framework::OpenRlhf, "algorithm.value_epochs");
    assert!(note.contains("train.max_epochs"), "{note}");
    // γ and λ written by their rows are not also listed as pinned to 1.
    let gae_c = RunConfig::preset("transformer-sort")
        .unwrap()
        .with_overrides(&["algorithm.advantage=gae".to_string()])
        .unwrap();
    for (fw, gamma) in [
        (Framework::Verl, "algorithm.gamma"),
        (Framework::OpenRlhf, "algo.advantage.gamma"),
    ] {
        let b = export::export(&gae_c, fw, &lenient()).unwrap();
        assert!(
            b.plan.pinned.iter().all(|p| p.key != gamma),
            "{}",
            fw.name()
        );
        let plain = export::export(
            &RunConfig::preset("transformer-sort").unwrap(),
            fw,
            &lenient(),
        );
        assert!(
            plain.unwrap().plan.pinned.iter().any(|p| p.key == gamma),
            "{}",
            fw.name()
        );
    }
}

#[test]
fn the_batch_arithmetic_is_each_frameworks_own() {
    let c = RunConfig::preset("random-sort")
        .unwrap()
        .with_overrides(&[
            "algorithm.prompts_per_iteration=8".into(),
            "algorithm.num_generations=4".into(),
            "algorithm.mu=2".into(),
            "run.iterations=50".into(),
        ])
        .unwrap();
    let get = |fw: Framework, key: &str| -> Val {
        let b = export::export(&c, fw, &lenient()).unwrap();
        b.plan
            .settings()
            .into_iter()
            .find(|(k, _)| k == key)
            .unwrap_or_else(|| panic!("{key}"))
            .1
    };
    // TRL counts completions and optimizer steps.
    assert_eq!(get(Framework::Trl, "generation_batch_size"), Val::Int(32));
    assert_eq!(
        get(Framework::Trl, "per_device_train_batch_size"),
        Val::Int(4)
    );
    assert_eq!(
        get(Framework::Trl, "gradient_accumulation_steps"),
        Val::Int(8)
    );
    assert_eq!(get(Framework::Trl, "num_iterations"), Val::Int(2));
    assert_eq!(get(Framework::Trl, "max_steps"), Val::Int(100));
    // verl counts prompts and multiplies by n; steps are iterations.
    assert_eq!(get(Framework::Verl, "data.train_batch_size"), Val::Int(8));
    assert_eq!(
        get(Framework::Verl, "actor_rollout_ref.rollout.n"),
        Val::Int(4)
    );
    assert_eq!(
        get(
            Framework::Verl,
            "actor_rollout_ref.actor.ppo_mini_batch_size"
        ),
        Val::Int(8)
    );
    assert_eq!(
        get(Framework::Verl, "trainer.total_training_steps"),
        Val::Int(50)
    );
    // OpenRLHF: prompts for rollouts, samples for training.
    assert_eq!(get(Framework::OpenRlhf, "rollout.batch_size"), Val::Int(8));
    assert_eq!(get(Framework::OpenRlhf, "train.batch_size"), Val::Int(32));
    // Defaults that moved between versions are written, never left out.
    assert_eq!(get(Framework::Trl, "beta"), Val::Float(0.0));
    assert_eq!(get(Framework::Trl, "loss_type"), Val::str("grpo"));
    assert_eq!(get(Framework::Trl, "scale_rewards"), Val::str("group"));
    assert_eq!(
        get(Framework::Verl, "algorithm.norm_adv_by_std_in_grpo"),
        Val::Bool(true)
    );
}

#[test]
fn export_cli_writes_the_bundle_and_refuses_by_name() {
    let out = temp_dir("export-cli");
    let mut args = vec!["export", "--to", "verl", "--preset", "lecture17"];
    for s in &WINNER {
        args.extend(["--set", s]);
    }
    let dir = out.join("verl");
    args.extend(["--out", dir.to_str().unwrap()]);
    let o = grpo_lab(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    for f in [
        "run_verl.sh",
        "reward.py",
        "reward_cases.json",
        "data/train.jsonl",
        "data/heldout.jsonl",
        "data/make_parquet.py",
        "MAPPING.md",
        "grpo-lab.toml",
    ] {
        assert!(dir.join(f).exists(), "{f}");
    }
    // Approximations are warned by name.
    let err = stderr(&o);
    assert!(err.contains("warning: algorithm.ref_period"), "{err}");
    assert!(err.contains("warning: algorithm.advantage"), "{err}");
    let train = std::fs::read_to_string(dir.join("data/train.jsonl")).unwrap();
    assert_eq!(train.lines().count(), 3);
    assert!(train.contains("\"ground_truth\":\"0 1 2\""), "{train}");
    // Again without --force: refused.
    let o = grpo_lab(&args);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    // The lecture's own config (naive loss, μ = 10): no counterpart, named, exit 2.
    let o = grpo_lab(&[
        "export",
        "--to",
        "trl",
        "--preset",
        "lecture17",
        "--out",
        out.join("trl").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("`algorithm.loss`"), "{}", stderr(&o));
    assert!(!out.join("trl").exists());
    // Nothing to export from.
    let o = grpo_lab(&[
        "export",
        "--to",
        "trl",
        "--out",
        out.join("x").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let o = grpo_lab(&[
        "export",
        "--to",
        "nemo",
        "--preset",
        "lecture17",
        "--out",
        "x",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&out);
}

/// Python blocks without Python: each line that opens a block (ends with `:` outside a comment)
/// is followed by a more indented one, and no line inside a bracket sits at column 0.
fn python_blocks_indented(name: &str, text: &str) {
    // Triple-quoted strings (docstrings) as empty ones: their lines are text, not code.
    let mut flat = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(r#"""""#).or_else(|| rest.find("'''")) {
        let q = &rest[at..at + 3];
        flat.push_str(&rest[..at + 3]);
        let end = rest[at + 3..].find(q).map_or(rest.len(), |e| at + 3 + e);
        rest = &rest[end..];
    }
    flat.push_str(rest);
    let lines: Vec<&str> = flat.lines().filter(|l| !l.trim().is_empty()).collect();
    let indent = |l: &str| l.len() - l.trim_start().len();
    let mut open = 0i32;
    // A line's code: up to a `#` outside a string, with the strings' contents left out.
    let code_of = |l: &str| {
        let (mut code, mut quote, mut escaped) = (String::new(), None, false);
        for c in l.chars() {
            match quote {
                Some(q) => {
                    if !escaped && c == q {
                        quote = None;
                        code.push(c);
                    }
                    escaped = !escaped && c == '\\';
                }
                None if c == '#' => break,
                None => {
                    if c == '"' || c == '\'' {
                        quote = Some(c);
                    }
                    code.push(c);
                }
            }
        }
        code.trim_end().to_string()
    };
    for (i, l) in lines.iter().enumerate() {
        let code = code_of(l);
        if code.trim().is_empty() {
            continue;
        }
        if open > 0 {
            assert!(
                indent(l) > 0 || code.starts_with(')'),
                "{name}: `{l}` inside a bracket at column 0"
            );
        }
        if code.ends_with(':') {
            let next = lines.get(i + 1).copied().unwrap_or("");
            assert!(
                indent(next) > indent(l),
                "{name}: `{l}` opens a block, `{next}` is not indented"
            );
        }
        for c in code.chars() {
            open += match c {
                '(' | '[' | '{' => 1,
                ')' | ']' | '}' => -1,
                _ => 0,
            };
        }
    }
}

/// Every exported script is well formed whatever the run's name holds (quotes, `$`, braces,
/// brackets, backquotes): Python's blocks indented (checked here; compiled by python3 where
/// present), the shell scripts parsed by `bash -n`, and the name read back from each
/// framework's config as written.
#[test]
fn the_exported_scripts_are_well_formed() {
    let out = temp_dir("export-scripts");
    let name = "it's $HOME {a,b} [x] `id`";
    let mut sets = WINNER.map(String::from).to_vec();
    sets.push(format!("run.name={name}"));
    let c = RunConfig::preset("lecture17")
        .unwrap()
        .with_overrides(&sets)
        .unwrap();
    assert_eq!(c.run.name, name);
    let python = Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    for fw in Framework::ALL {
        let dir = out.join(fw.name());
        let b = export::export(&c, fw, &lenient()).unwrap();
        b.write(&dir).unwrap();
        let written = export::parse_written(fw, b.file(fw.config_file()).unwrap());
        assert!(
            written.iter().any(|(_, v)| *v == Val::Str(name.into())),
            "{}: the run's name is not read back: {written:?}",
            fw.name()
        );
        let mut files = vec![];
        for sub in [dir.clone(), dir.join("data")] {
            for e in std::fs::read_dir(&sub).into_iter().flatten().flatten() {
                files.push(e.path());
            }
        }
        let (mut py, mut sh) = (0, 0);
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap_or_default();
            let shown = f.display().to_string();
            let check = |cmd: &str, args: &[&str]| {
                let o = Command::new(cmd).args(args).arg(&f).output().unwrap();
                assert!(
                    o.status.success(),
                    "{shown}: {}",
                    String::from_utf8_lossy(&o.stderr)
                );
            };
            match f.extension().and_then(|e| e.to_str()) {
                Some("py") => {
                    py += 1;
                    python_blocks_indented(&shown, &text);
                    if python {
                        check("python3", &["-m", "py_compile"]);
                    }
                }
                Some("sh") => {
                    sh += 1;
                    check("bash", &["-n"]);
                }
                _ => {}
            }
        }
        assert!(
            py >= 1 && py + sh >= 2,
            "{}: {py} Python files, {sh} shell scripts",
            fw.name()
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// A two-iteration lecture17 run (logged groups included).
fn short_run(name: &str) -> std::path::PathBuf {
    let out = temp_dir(name);
    let mut args = vec![
        "train",
        "--preset",
        "lecture17",
        "--quiet",
        "--device",
        "cpu",
    ];
    for s in WINNER {
        args.extend(["--set", s]);
    }
    args.extend(["--set", "run.iterations=2", "--set", "algorithm.mu=3"]);
    args.extend(["--out", out.to_str().unwrap()]);
    let o = grpo_lab(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    out
}

#[test]
fn export_log_writes_tensorboard_events_that_decode_and_unipo_json() {
    let run = short_run("export-log");
    let records = grpo_lab::train::read_metrics(&run.join("metrics.jsonl")).unwrap();
    assert_eq!(records.len(), 6);

    // A run directory exports to every framework too.
    let o = grpo_lab(&[
        "export",
        "--to",
        "openrlhf",
        run.to_str().unwrap(),
        "--out",
        run.join("openrlhf").to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));

    let o = grpo_lab(&["export-log", "--to", "tensorboard", run.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let files: Vec<_> = std::fs::read_dir(run.join("tensorboard"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1);
    let name = files[0].file_name().unwrap().to_str().unwrap().to_string();
    assert!(name.starts_with("events.out.tfevents."), "{name}");
    let bytes = std::fs::read(&files[0]).unwrap();
    let events = logs::read_events(&bytes).unwrap();
    // The version event, then one per optimizer step.
    assert_eq!(events.len(), 1 + records.len());
    assert_eq!(
        events[0].what,
        Some(logs::event::What::FileVersion("brain.Event:2".into()))
    );
    let scalars = |e: &logs::Event| -> Vec<(String, f32)> {
        match &e.what {
            Some(logs::event::What::Summary(s)) => s
                .value
                .iter()
                .map(|v| {
                    let Some(logs::summary_value::Value::SimpleValue(x)) = v.value else {
                        panic!("{v:?}")
                    };
                    (v.tag.clone(), x)
                })
                .collect(),
            other => panic!("{other:?}"),
        }
    };
    for (e, r) in events[1..].iter().zip(&records) {
        assert_eq!(e.step, r.step as i64);
        let s = scalars(e);
        let get = |t: &str| s.iter().find(|(k, _)| k == t).map(|(_, x)| *x);
        assert_eq!(get("train/reward"), Some(r.reward_mean));
        // TRL's reward_std: the groups' stds' mean, not the batch's.
        assert_eq!(get("train/reward_std"), r.reward_std_group);
        assert!(r.reward_std_group.is_some());
        assert_eq!(get("grpo_lab/reward/std"), Some(r.reward_std));
        assert_eq!(get("train/kl"), Some(r.kl));
        assert_eq!(get("train/learning_rate"), Some(r.lr));
        assert_eq!(get("grpo_lab/accuracy/train"), Some(r.accuracy_train));
        // Every finite scalar of the record is there.
        let finite = grpo_lab::metrics::CSV_COLUMNS
            .iter()
            .filter(|(n, _)| !matches!(*n, "iteration" | "step"))
            .filter(|(_, g)| g(r).is_some_and(f32::is_finite))
            .count();
        assert_eq!(s.len(), finite);
    }
    // A flipped byte fails the CRC.
    let mut bad = bytes.clone();
    let last = bad.len() - 6;
    bad[last] ^= 1;
    assert!(logs::read_events(&bad).unwrap_err().contains("CRC"));

    // verl's names: one point per iteration, x = iteration + 1.
    let verl_dir = run.join("tb-verl");
    let o = grpo_lab(&[
        "export-log",
        "--to",
        "tensorboard",
        "--names",
        "verl",
        run.to_str().unwrap(),
        "--out",
        verl_dir.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let f = std::fs::read_dir(&verl_dir)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let events = logs::read_events(&std::fs::read(f).unwrap()).unwrap();
    assert_eq!(
        events.iter().skip(1).map(|e| e.step).collect::<Vec<_>>(),
        [1, 2]
    );
    assert!(
        scalars(&events[1])
            .iter()
            .any(|(t, _)| t == "critic/score/mean")
    );
    // A verl step is the iteration: its actor metrics the mean of its optimizer steps, its
    // time their sum, the clip fraction both sides (verl's `pg_clipfrac_lower` is the dual
    // clip's, not logged here); the KL where this run pays it, in the loss.
    for (e, iteration) in events[1..].iter().zip(0..) {
        let s = scalars(e);
        let get = |t: &str| s.iter().find(|(k, _)| k == t).map(|(_, x)| *x);
        let steps: Vec<_> = records
            .iter()
            .filter(|r| r.iteration == iteration)
            .collect();
        assert_eq!(steps.len(), 3);
        let mean = |f: &dyn Fn(&grpo_lab::metrics::StepRecord) -> f32| {
            (steps.iter().map(|r| f(r) as f64).sum::<f64>() / steps.len() as f64) as f32
        };
        assert_eq!(get("actor/pg_loss"), Some(mean(&|r| r.loss)));
        assert_eq!(get("actor/kl_loss"), Some(mean(&|r| r.kl)));
        assert_eq!(get("actor/ppo_kl"), Some(mean(&|r| r.ppo_kl)));
        assert_eq!(
            get("actor/pg_clipfrac"),
            Some(mean(&|r| r.clip_ratio_low + r.clip_ratio_high))
        );
        assert_eq!(get("actor/pg_clipfrac_lower"), None);
        assert_eq!(
            get("grpo_lab/clip_ratio/high"),
            Some(mean(&|r| r.clip_ratio_high))
        );
        let secs: f64 = steps.iter().map(|r| r.step_time_secs as f64).sum();
        assert_eq!(get("timing_s/step"), Some(secs as f32));
        assert_eq!(get("critic/score/mean"), Some(steps[0].reward_mean));
        // The rollout's tokens once over the iteration's time; ranges stay ranges.
        let tokens = steps[0].tokens_per_second as f64 * steps[0].step_time_secs as f64;
        let rate = get("perf/throughput").unwrap() as f64;
        assert!(
            (rate * secs / tokens - 1.0).abs() < 1e-3,
            "{rate} {tokens} {secs}"
        );
        let lowest = steps.iter().map(|r| r.ratio_min).fold(f32::MAX, f32::min);
        assert_eq!(get("grpo_lab/ratio/min"), Some(lowest));
    }

    // UNIPO.
    let o = grpo_lab(&["export-log", "--to", "unipo", run.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("unipo.json")).unwrap()).unwrap();
    assert_eq!(v["header"]["algorithm"], "grpo");
    assert_eq!(v["header"]["totalSteps"], 6);
    assert_eq!(v["header"]["hparams"]["algorithm.beta"], 0.04);
    let entries = v["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 6);
    assert_eq!(entries[0]["is_first_step_after_rollout_phase"], true);
    assert_eq!(entries[1]["is_first_step_after_rollout_phase"], false);
    assert!(entries[0]["metrics"]["policy_objective"].is_number());
    // The last step of an iteration carries its groups, up to three prompts.
    let prompts = entries[2]["prompts"].as_array().unwrap();
    assert_eq!(prompts.len(), 3);
    let resp = &prompts[0]["responses"][0];
    let tokens = &resp["tokens"];
    assert_eq!(tokens["ids"].as_array().unwrap().len(), 3);
    for k in [
        "strings",
        "log_probs",
        "old_log_probs",
        "ref_log_probs",
        "advantages",
        "token_objective",
    ] {
        assert_eq!(tokens[k].as_array().unwrap().len(), 3, "{k}");
    }
    // The reference's log-probs are the ones metrics.jsonl logged.
    let logged = &records[2].groups.as_ref().unwrap()[0].ref_logp[0];
    let floats = |v: &serde_json::Value| -> Vec<f32> {
        let v = v.as_array().unwrap();
        v.iter().map(|x| x.as_f64().unwrap() as f32).collect()
    };
    assert_eq!(&floats(&tokens["ref_log_probs"]), logged);
    // Each token's objective is −(ℓ_t + β·KL_t): this run pays its KL in the loss.
    let config = grpo_lab::config::RunConfig::from_file(&run.join("config.toml")).unwrap();
    let s = grpo_lab::objective::loss::LossSettings::of(&config);
    assert!(s.kl_on());
    let g = &records[2].groups.as_ref().unwrap()[0];
    let a = g.advantages[config.algorithm.advantage.name()][0];
    let terms =
        grpo_lab::objective::loss::response_terms(&s, &g.logp[0], &g.old_logp[0], logged, a);
    let objective = floats(&tokens["token_objective"]);
    let with_kl: Vec<f32> = (0..3)
        .map(|t| -(terms.term[t] + s.beta * terms.kl_tokens[t]))
        .collect();
    assert_eq!(objective, with_kl);
    assert!(terms.kl_tokens.iter().any(|&k| k != 0.0), "a KL to see");
    assert!(entries[0].get("prompts").is_none());
    let o = grpo_lab(&["export-log", "--to", "wandb", run.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    // --out where a file is wanted and a directory is there: named, exit 2.
    let o = grpo_lab(&[
        "export-log",
        "--to",
        "unipo",
        run.to_str().unwrap(),
        "--out",
        run.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("--out") && stderr(&o).contains("a directory"),
        "{}",
        stderr(&o)
    );
    // A log whose steps repeat (two logs joined) is refused; one with a lost line warns.
    let metrics = run.join("metrics.jsonl");
    let text = std::fs::read_to_string(&metrics).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    std::fs::write(&metrics, format!("{text}{}\n", lines[..2].join("\n"))).unwrap();
    let o = grpo_lab(&["export-log", "--to", "unipo", run.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("repeats or reorders steps"),
        "{}",
        stderr(&o)
    );
    let kept: Vec<&str> = lines
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 2)
        .map(|(_, l)| *l)
        .collect();
    std::fs::write(&metrics, kept.join("\n") + "\n").unwrap();
    let o = grpo_lab(&["export-log", "--to", "unipo", run.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("1 steps missing"), "{}", stderr(&o));
    std::fs::write(&metrics, "").unwrap();
    let o = grpo_lab(&["export-log", "--to", "unipo", run.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&run);
}

/// Where python3 is installed: the exported reward module's doctests (the worked values) pass,
/// and a minimal TFRecord reader in Python reads the event file. Skipped without python3.
#[test]
fn python_checks_where_python_is_present() {
    let Ok(v) = Command::new("python3").arg("--version").output() else {
        eprintln!("skipping: no python3");
        return;
    };
    if !v.status.success() {
        eprintln!("skipping: no python3");
        return;
    }
    let out = temp_dir("export-python");
    let c = RunConfig::preset("random-sort")
        .unwrap()
        .with_overrides(&["task.reward_weights={ exact = 1.0, distance = 0.25 }".into()])
        .unwrap();
    let b = export::export(&c, Framework::Trl, &lenient()).unwrap();
    b.write(&out).unwrap();
    let o = Command::new("python3")
        .args(["-m", "doctest", "reward.py"])
        .current_dir(&out)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    // The TFRecord framing, read by Python's own struct (CRC not checked there).
    let bytes = logs::tensorboard(&[], logs::Names::Trl, 1.0e9, logs::LogContext::default());
    let path = out.join("events.out.tfevents.1.test");
    std::fs::write(&path, bytes).unwrap();
    let script = "import struct,sys\nb=open(sys.argv[1],'rb').read()\nn=struct.unpack('<Q',b[:8])[0]\nassert b[12:12+n].find(b'brain.Event:2')>0\nprint('ok')\n";
    let o = Command::new("python3")
        .args(["-c", script, path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let _ = std::fs::remove_dir_all(&out);
}

/// The TRL export runs as written on a machine without a GPU: a tiny local model made with
/// `transformers` (bench/reference/tiny_model.py, no download), then `train_trl.py` for two
/// optimizer steps in TRL, as the README says. Skipped, with a line saying so, where `trl` does
/// not import (CI has no Python packages: this never stands in its way).
#[test]
fn the_trl_export_trains_two_steps_on_a_cpu_where_trl_imports() {
    let py = match framework_python("TRL", "trl, transformers, datasets, torch") {
        Ok(py) => py,
        Err(why) => {
            eprintln!("skipping the TRL run: {why} (pip install \"trl==1.9.0\" datasets)");
            return;
        }
    };
    let out = temp_dir("export-trl-run");
    let o = grpo_lab(&[
        "export",
        "--to",
        "trl",
        "--preset",
        "random-sort",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let maker = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/reference/tiny_model.py");
    let cpu_only = |c: &mut Command| {
        c.current_dir(&out)
            .env("CUDA_VISIBLE_DEVICES", "")
            .env("HF_HUB_OFFLINE", "1")
            .env("TRANSFORMERS_OFFLINE", "1");
    };
    let mut make = Command::new(&py);
    make.args([maker, "tiny-model"]);
    cpu_only(&mut make);
    let o = make.output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let mut train = Command::new(&py);
    train.args([
        "train_trl.py",
        "--model",
        "tiny-model",
        "--max-steps",
        "2",
        "--output-dir",
        "trl-out",
    ]);
    cpu_only(&mut train);
    let o = train.output().unwrap();
    let all = format!("{}{}", String::from_utf8_lossy(&o.stdout), stderr(&o));
    assert!(o.status.success(), "train_trl.py failed:\n{all}");
    let state: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("trl-out/checkpoint-2/trainer_state.json"))
            .unwrap_or_else(|e| panic!("no checkpoint of step 2 ({e}):\n{all}")),
    )
    .unwrap();
    assert_eq!(state["global_step"], 2, "{state}");
    let _ = std::fs::remove_dir_all(&out);
}

/// The Python for one framework: `GRPO_LAB_<NAME>_PYTHON`, else `GRPO_LAB_PYTHON`, else
/// `python3` (verl 0.7 pins `transformers<5`, TRL 1.9 wants 5: two environments are usual).
/// Where it does not import, the check is skipped — or fails, with
/// `GRPO_LAB_REQUIRE_FRAMEWORKS=1` (a machine meant to have them, where a broken environment
/// must not pass as a skip).
fn framework_python(name: &str, modules: &str) -> Result<String, String> {
    let found = find_framework_python(name, modules);
    if let Err(why) = &found
        && std::env::var_os("GRPO_LAB_REQUIRE_FRAMEWORKS").is_some()
    {
        panic!("GRPO_LAB_REQUIRE_FRAMEWORKS is set, but {why}");
    }
    found
}

fn find_framework_python(name: &str, modules: &str) -> Result<String, String> {
    let py = std::env::var(format!("GRPO_LAB_{name}_PYTHON"))
        .or_else(|_| std::env::var("GRPO_LAB_PYTHON"))
        .unwrap_or_else(|_| "python3".into());
    match Command::new(&py)
        .args(["-c", &format!("import {modules}")])
        .output()
    {
        Ok(o) if o.status.success() => Ok(py),
        Ok(o) => Err(format!(
            "{py} cannot import {modules} ({})",
            stderr(&o).lines().last().unwrap_or("")
        )),
        Err(e) => Err(format!("no {py}: {e}")),
    }
}

/// A directory whose `python3` is `py` (the exported shell scripts call `python3`).
#[cfg(unix)]
fn python3_dir(py: &str, name: &str, body: Option<&str>) -> std::path::PathBuf {
    let dir = temp_dir(name);
    std::fs::create_dir_all(&dir).unwrap();
    let shim = dir.join("python3");
    let script = match body {
        Some(body) => format!("#!/bin/sh\n{body}\n"),
        None => format!("#!/bin/sh\nexec '{py}' \"$@\"\n"),
    };
    std::fs::write(&shim, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

#[cfg(unix)]
fn path_with(dir: &std::path::Path) -> String {
    format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// verl without a GPU: `run_verl.sh --cfg job` composes main_ppo's Hydra config with every
/// exported override (an unknown key or a bad value fails there) and prints it. Skipped where
/// verl does not import.
#[cfg(unix)]
#[test]
fn the_verl_export_composes_in_verl_where_verl_imports() {
    let py = match framework_python("VERL", "verl.trainer.main_ppo") {
        Ok(py) => py,
        Err(why) => {
            eprintln!("skipping the verl check: {why} (pip install \"verl==0.7.0\")");
            return;
        }
    };
    let out = temp_dir("export-verl-run");
    let o = grpo_lab(&[
        "export",
        "--to",
        "verl",
        "--preset",
        "random-sort",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let bin = python3_dir(&py, "verl-python", None);
    let o = Command::new("bash")
        .args([out.join("run_verl.sh").to_str().unwrap(), "--cfg", "job"])
        .env("PATH", path_with(&bin))
        .env("CUDA_VISIBLE_DEVICES", "")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{text}{}", stderr(&o));
    for want in ["adv_estimator: grpo", "ppo_epochs: 4", "'n': 16"] {
        assert!(
            text.contains(want),
            "the composed config lacks `{want}`:\n{text}"
        );
    }
    let _ = std::fs::remove_dir_all(&out);
    let _ = std::fs::remove_dir_all(&bin);
}

/// OpenRLHF without a GPU: its `train_ppo_ray` imports Ray, DeepSpeed and vLLM before it parses
/// anything, so the check runs the module's own argument parser (its `__main__` block up to
/// `parse_args`, read from the installed package) on every flag `run_openrlhf.sh` passes: an
/// unknown flag or a bad value fails as it would there. Skipped where openrlhf is not installed.
#[cfg(unix)]
#[test]
fn the_openrlhf_export_parses_in_openrlhf_where_it_is_installed() {
    // Installed, not imported (its package imports need a GPU stack).
    let py = match framework_python(
        "OPENRLHF",
        "importlib.util as u; assert u.find_spec('openrlhf')",
    ) {
        Ok(py) => py,
        Err(why) => {
            eprintln!(
                "skipping the OpenRLHF check: {why} (pip install --no-deps \"openrlhf==0.11.0\")"
            );
            return;
        }
    };
    let out = temp_dir("export-openrlhf-run");
    let o = grpo_lab(&[
        "export",
        "--to",
        "openrlhf",
        "--preset",
        "random-sort",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let parse_only = r#"
import ast, importlib.util, os, sys
root = importlib.util.find_spec("openrlhf").submodule_search_locations[0]
tree = ast.parse(open(os.path.join(root, "cli", "train_ppo_ray.py")).read())
main = next(n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test))
body = ast.parse("import argparse, os\nfrom datetime import datetime").body
for st in main.body:
    body.append(st)
    if "parse_args" in ast.unparse(st):
        break
sys.argv = ["train_ppo_ray"] + sys.argv[1:]
ns = {}
exec(compile(ast.fix_missing_locations(ast.Module(body=body, type_ignores=[])), "train_ppo_ray", "exec"), ns)
print("parsed", len(vars(ns["args"])), "settings")
"#;
    let script = out.join("parse_only.py");
    std::fs::write(&script, parse_only).unwrap();
    // `python3 -m openrlhf.cli.train_ppo_ray FLAGS`: the module's parser on FLAGS.
    let body = format!(
        "[ \"$1\" = -m ] && [ \"$2\" = openrlhf.cli.train_ppo_ray ] || exit 97\nshift 2\nexec '{py}' '{}' \"$@\"",
        script.display()
    );
    let bin = python3_dir(&py, "openrlhf-python", Some(&body));
    let o = Command::new("bash")
        .arg(out.join("run_openrlhf.sh"))
        .env("PATH", path_with(&bin))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{text}{}", stderr(&o));
    assert!(text.contains("parsed "), "{text}");
    let _ = std::fs::remove_dir_all(&out);
    let _ = std::fs::remove_dir_all(&bin);
}
