//! A run's `metrics.jsonl` for the tools people already read: TensorBoard event files (every
//! scalar, under TRL's or verl's metric names where they have one) and UNIPO's canonical JSON
//! (the GRPO visualizer of poloclub/unipo, `docs/canonical_schema.json`).
//!
//! TensorBoard's format: a TFRecord file (`u64` length, masked CRC-32C of the length, the
//! bytes, masked CRC-32C of the bytes) of `tensorflow.Event` protobufs; the messages are
//! structs with the field numbers of TensorFlow's `event.proto` and `summary.proto`, encoded
//! and decoded with `prost`'s field codecs (no protoc, no build script, no derive macro).

use crate::config::{LossMode, RunConfig};
use crate::metrics::{CSV_COLUMNS, StepRecord};
use crate::task::tokenizer::{EOS_ID, MAX_NUMBERS, PAD_ID};
use prost::Message;

/// `tensorflow.Event` (event.proto): the fields TensorBoard needs for scalars.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Event {
    /// Field 1, `double`.
    pub wall_time: f64,
    /// Field 2, `int64`.
    pub step: i64,
    /// `oneof what`: field 3 or 5.
    pub what: Option<event::What>,
}

pub mod event {
    #[derive(Debug, Clone, PartialEq)]
    pub enum What {
        /// Field 3, `string`: the first event of a file, `brain.Event:2`.
        FileVersion(String),
        /// Field 5, `Summary`.
        Summary(super::Summary),
    }
}

/// `tensorflow.Summary` (summary.proto).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    /// Field 1, `repeated Value`.
    pub value: Vec<SummaryValue>,
}

/// `tensorflow.Summary.Value` with its `simple_value` (in the proto's `oneof value`, so a
/// 0.0 is still written).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SummaryValue {
    /// Field 1, `string`.
    pub tag: String,
    /// `oneof value`: field 2.
    pub value: Option<summary_value::Value>,
}

pub mod summary_value {
    #[derive(Debug, Clone, PartialEq)]
    pub enum Value {
        /// Field 2, `float`.
        SimpleValue(f32),
    }
}

// The three messages' wire format written out with prost's field codecs (prost's derive macro
// would pull a second build of the proc-macro stack under burn's; these are the few lines it
// would generate). Proto3: a scalar at its default is not written; a oneof member always is.
use prost::bytes::{Buf, BufMut};
use prost::encoding::{self as pb, DecodeContext, WireType};

impl Message for Event {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        if self.wall_time != 0.0 {
            pb::double::encode(1, &self.wall_time, buf);
        }
        if self.step != 0 {
            pb::int64::encode(2, &self.step, buf);
        }
        match &self.what {
            Some(event::What::FileVersion(v)) => pb::string::encode(3, v, buf),
            Some(event::What::Summary(m)) => pb::message::encode(5, m, buf),
            None => {}
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        match tag {
            1 => pb::double::merge(wire_type, &mut self.wall_time, buf, ctx),
            2 => pb::int64::merge(wire_type, &mut self.step, buf, ctx),
            3 => {
                let mut v = String::new();
                pb::string::merge(wire_type, &mut v, buf, ctx)?;
                self.what = Some(event::What::FileVersion(v));
                Ok(())
            }
            5 => {
                let mut m = match self.what.take() {
                    Some(event::What::Summary(m)) => m,
                    _ => Summary::default(),
                };
                pb::message::merge(wire_type, &mut m, buf, ctx)?;
                self.what = Some(event::What::Summary(m));
                Ok(())
            }
            _ => pb::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let mut n = 0;
        if self.wall_time != 0.0 {
            n += pb::double::encoded_len(1, &self.wall_time);
        }
        if self.step != 0 {
            n += pb::int64::encoded_len(2, &self.step);
        }
        n + match &self.what {
            Some(event::What::FileVersion(v)) => pb::string::encoded_len(3, v),
            Some(event::What::Summary(m)) => pb::message::encoded_len(5, m),
            None => 0,
        }
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

impl Message for Summary {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        pb::message::encode_repeated(1, &self.value, buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        match tag {
            1 => pb::message::merge_repeated(wire_type, &mut self.value, buf, ctx),
            _ => pb::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        pb::message::encoded_len_repeated(1, &self.value)
    }

    fn clear(&mut self) {
        self.value.clear();
    }
}

impl Message for SummaryValue {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        if !self.tag.is_empty() {
            pb::string::encode(1, &self.tag, buf);
        }
        if let Some(summary_value::Value::SimpleValue(v)) = &self.value {
            pb::float::encode(2, v, buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        match tag {
            1 => pb::string::merge(wire_type, &mut self.tag, buf, ctx),
            2 => {
                let mut v = 0f32;
                pb::float::merge(wire_type, &mut v, buf, ctx)?;
                self.value = Some(summary_value::Value::SimpleValue(v));
                Ok(())
            }
            _ => pb::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let mut n = 0;
        if !self.tag.is_empty() {
            n += pb::string::encoded_len(1, &self.tag);
        }
        if let Some(summary_value::Value::SimpleValue(v)) = &self.value {
            n += pb::float::encoded_len(2, v);
        }
        n
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

/// TFRecord's masked CRC-32C.
pub fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// One TFRecord: length, its CRC, the bytes, their CRC.
pub fn record(data: &[u8], out: &mut Vec<u8>) {
    let len = (data.len() as u64).to_le_bytes();
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
}

/// Read TFRecords back, checking both CRCs of each, and decode them as events.
pub fn read_events(mut bytes: &[u8]) -> Result<Vec<Event>, String> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        if bytes.len() < 12 {
            return Err(format!(
                "{} trailing bytes: a record cut short",
                bytes.len()
            ));
        }
        let len_bytes = &bytes[..8];
        let len = u64::from_le_bytes(len_bytes.try_into().expect("8 bytes")) as usize;
        let len_crc = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        if len_crc != masked_crc(len_bytes) {
            return Err(format!(
                "record {}: the length's CRC does not match",
                out.len()
            ));
        }
        let end = 12 + len + 4;
        if bytes.len() < end {
            return Err(format!("record {}: cut short", out.len()));
        }
        let data = &bytes[12..12 + len];
        let crc = u32::from_le_bytes(bytes[12 + len..end].try_into().expect("4 bytes"));
        if crc != masked_crc(data) {
            return Err(format!(
                "record {}: the data's CRC does not match",
                out.len()
            ));
        }
        out.push(Event::decode(data).map_err(|e| format!("record {}: {e}", out.len()))?);
        bytes = &bytes[end..];
    }
    Ok(out)
}

/// Whose metric names the event file uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Names {
    /// TRL's `GRPOTrainer` logs (`train/reward`, ...); x = optimizer step.
    Trl,
    /// verl's `main_ppo` logs (`critic/score/mean`, ...); x = iteration (one rollout), the
    /// last optimizer step of each iteration.
    Verl,
    /// grpo-lab's own names; x = optimizer step.
    GrpoLab,
}

impl Names {
    pub const NAMES: &'static [&'static str] = &["trl", "verl", "grpo-lab"];
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "trl" => Some(Names::Trl),
            "verl" => Some(Names::Verl),
            "grpo-lab" => Some(Names::GrpoLab),
            _ => None,
        }
    }
}

/// grpo-lab metric → (TRL name, verl name). TRL's names are what `GRPOTrainer` v1.9.0 logs
/// (TensorBoard adds `train/`); verl's what v0.7.0's `metric_utils.py` and actor log. A
/// metric without a counterpart keeps its name under `grpo_lab/`: no scalar is dropped.
pub const METRIC_NAMES: &[(&str, Option<&str>, Option<&str>)] = &[
    (
        "reward/mean",
        Some("train/reward"),
        Some("critic/score/mean"),
    ),
    // TRL's `reward_std` is the mean of the groups' stds, not the batch's.
    ("reward/group_std", Some("train/reward_std"), None),
    ("reward/min", None, Some("critic/score/min")),
    ("reward/max", None, Some("critic/score/max")),
    (
        "frac_reward_zero_std",
        Some("train/frac_reward_zero_std"),
        None,
    ),
    (
        "reward/exact_match",
        Some("train/rewards/exact_reward/mean"),
        None,
    ),
    (
        "completions/mean_length",
        Some("train/completions/mean_length"),
        Some("response_length/mean"),
    ),
    (
        "completions/min_length",
        Some("train/completions/min_length"),
        Some("response_length/min"),
    ),
    (
        "completions/max_length",
        Some("train/completions/max_length"),
        Some("response_length/max"),
    ),
    (
        "completions/clipped_ratio",
        Some("train/completions/clipped_ratio"),
        Some("response_length/clip_ratio"),
    ),
    ("loss", Some("train/loss"), Some("actor/pg_loss")),
    // verl's name for the KL depends on where the run pays it: [`tensorboard`] picks it.
    ("kl", Some("train/kl"), None),
    ("entropy", Some("train/entropy"), Some("actor/entropy")),
    // verl's `actor/pg_clipfrac` is both sides together (written from the two), and its
    // `pg_clipfrac_lower` is the dual clip's fraction, which is not this.
    ("clip_ratio/low", Some("train/clip_ratio/low_mean"), None),
    ("clip_ratio/high", Some("train/clip_ratio/high_mean"), None),
    ("ppo_kl", None, Some("actor/ppo_kl")),
    (
        "grad_norm",
        Some("train/grad_norm"),
        Some("actor/grad_norm"),
    ),
    ("lr", Some("train/learning_rate"), Some("actor/lr")),
    ("step_time_secs", None, Some("timing_s/step")),
    ("tokens_per_second", None, Some("perf/throughput")),
];

/// The tag a metric gets under a naming.
pub fn tag(names: Names, metric: &str) -> String {
    let theirs =
        METRIC_NAMES
            .iter()
            .find(|(m, _, _)| *m == metric)
            .and_then(|(_, t, v)| match names {
                Names::Trl => *t,
                Names::Verl => *v,
                Names::GrpoLab => Some(metric),
            });
    match theirs {
        Some(t) => t.to_string(),
        None => format!("grpo_lab/{metric}"),
    }
}

/// Where the run pays its KL: verl logs it as `actor/kl_loss` in the loss, as
/// `actor/reward_kl_penalty` in the reward, and not at all without one (β = 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KlRole {
    Loss,
    Reward,
    None,
}

impl KlRole {
    pub fn of(c: &RunConfig) -> Self {
        match (c.algorithm.beta > 0.0, c.algorithm.kl_penalty) {
            (false, _) => Self::None,
            (true, crate::config::KlPenaltyMode::Loss) => Self::Loss,
            (true, _) => Self::Reward,
        }
    }
}

/// What of the run's config picks a tag: where it pays its KL (verl), and whether its
/// advantages divide by the batch's std (TRL's `scale_rewards = "batch"`, whose
/// `reward_std` is the batch's; otherwise the groups' mean std).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogContext {
    pub kl: KlRole,
    pub batch_std: bool,
}

impl Default for LogContext {
    /// A log without its config: no KL name, TRL's default `reward_std` (the groups').
    fn default() -> Self {
        Self {
            kl: KlRole::None,
            batch_std: false,
        }
    }
}

impl LogContext {
    pub fn of(c: &RunConfig) -> Self {
        Self {
            kl: KlRole::of(c),
            batch_std: c.algorithm.advantage == crate::config::AdvantageMode::BatchNormalized,
        }
    }

    /// The tag of `metric` under `names` in this run.
    fn tag(&self, names: Names, metric: &str) -> String {
        match (names, metric, self.kl, self.batch_std) {
            (Names::Verl, "kl", KlRole::Loss, _) => "actor/kl_loss".into(),
            (Names::Verl, "kl", KlRole::Reward, _) => "actor/reward_kl_penalty".into(),
            (Names::Trl, "reward/std", _, true) => "train/reward_std".into(),
            (Names::Trl, "reward/group_std", _, true) => "grpo_lab/reward/group_std".into(),
            _ => tag(names, metric),
        }
    }
}

/// The event file of a run, stamped from `start_wall_time` plus the steps' durations: every
/// scalar of [`CSV_COLUMNS`] (NaN and missing values left out). Under TRL's names (and
/// grpo-lab's) one event per optimizer step; under verl's one per iteration (x = iteration +
/// 1), as verl logs a training step: the mean of the iteration's optimizer steps (its actor
/// metrics are means over its updates), `timing_s/step` their sum, `perf/throughput` their
/// tokens over that time, and `actor/pg_clipfrac` both clip sides together.
pub fn tensorboard(
    records: &[StepRecord],
    names: Names,
    start_wall_time: f64,
    run: LogContext,
) -> Vec<u8> {
    let mut out = Vec::new();
    let first = Event {
        wall_time: start_wall_time,
        step: 0,
        what: Some(event::What::FileVersion("brain.Event:2".into())),
    };
    record(&first.encode_to_vec(), &mut out);
    let scalar = |tag: String, v: f32| SummaryValue {
        tag,
        value: Some(summary_value::Value::SimpleValue(v)),
    };
    let mut wall = start_wall_time;
    let mut first_of_iteration = 0;
    for (i, r) in records.iter().enumerate() {
        wall += r.step_time_secs.max(0.0) as f64;
        let last_of_iteration = records
            .get(i + 1)
            .is_none_or(|next| next.iteration != r.iteration);
        let step = match names {
            Names::Verl if !last_of_iteration => continue,
            Names::Verl => r.iteration as i64 + 1,
            _ => r.step as i64,
        };
        let steps = match names {
            Names::Verl => &records[first_of_iteration..=i],
            _ => std::slice::from_ref(r),
        };
        first_of_iteration = i + 1;
        let mut value: Vec<SummaryValue> = CSV_COLUMNS
            .iter()
            .filter(|(name, _)| !matches!(*name, "iteration" | "step"))
            .filter_map(|(name, get)| {
                let v = over_steps(steps, name, get)?;
                Some(scalar(run.tag(names, name), v))
            })
            .collect();
        if names == Names::Verl {
            let both = |r: &StepRecord| Some(r.clip_ratio_low + r.clip_ratio_high);
            if let Some(v) = over_steps(steps, "", &both) {
                value.push(scalar("actor/pg_clipfrac".into(), v));
            }
        }
        let e = Event {
            wall_time: wall,
            step,
            what: Some(event::What::Summary(Summary { value })),
        };
        record(&e.encode_to_vec(), &mut out);
    }
    out
}

/// One scalar over optimizer steps (one, or an iteration's): the mean of its finite values;
/// the step time summed, and the throughput as tokens over that time.
fn over_steps(
    steps: &[StepRecord],
    name: &str,
    get: &dyn Fn(&StepRecord) -> Option<f32>,
) -> Option<f32> {
    let finite = |r: &StepRecord| get(r).filter(|v| v.is_finite());
    if let [one] = steps {
        return finite(one);
    }
    let time = |r: &StepRecord| r.step_time_secs.max(0.0) as f64;
    let values: Vec<f32> = steps.iter().filter_map(finite).collect();
    let sum = || values.iter().map(|&v| v as f64).sum::<f64>();
    match name {
        // Every step of an iteration trains on its one rollout: its tokens once (each step's
        // rate times its time gives them again), over the iteration's time.
        "tokens_per_second" => {
            let tokens = steps
                .iter()
                .map(|r| r.tokens_per_second as f64 * time(r))
                .sum::<f64>()
                / steps.len().max(1) as f64;
            let secs: f64 = steps.iter().map(time).sum();
            (secs > 0.0)
                .then(|| (tokens / secs) as f32)
                .filter(|v| v.is_finite())
        }
        _ if values.is_empty() => None,
        "step_time_secs" => Some(sum() as f32),
        // A range over the steps stays one: the smallest minimum, the largest maximum.
        n if n.ends_with("/min") => values.iter().copied().reduce(f32::min),
        n if n.ends_with("/max") => values.iter().copied().reduce(f32::max),
        _ => Some((sum() / values.len() as f64) as f32),
    }
}

/// The file name TensorBoard looks for.
pub fn event_file_name(wall_time: f64, host: &str) -> String {
    format!("events.out.tfevents.{}.{host}", wall_time as u64)
}

fn token_string(id: u32) -> String {
    match id {
        id if id < MAX_NUMBERS => id.to_string(),
        EOS_ID => "<eos>".into(),
        PAD_ID => "<pad>".into(),
        _ => "<unk>".into(),
    }
}

/// UNIPO's name for the algorithm a config runs (its five: reinforce, ppo, grpo, dapo, drgrpo).
pub fn unipo_algorithm(c: &RunConfig) -> &'static str {
    use crate::config::{AdvantageMode, LossAggMode};
    let a = &c.algorithm;
    if a.loss == LossMode::Naive {
        return "reinforce";
    }
    match (a.advantage, a.loss_agg_mode) {
        (AdvantageMode::Centered, LossAggMode::SeqMeanTokenSumNorm) => "drgrpo",
        (_, LossAggMode::TokenMean) if a.epsilon_high > a.epsilon_low || a.dynamic_sampling => {
            "dapo"
        }
        _ => "grpo",
    }
}

/// UNIPO's canonical JSON of a run: the header (task, reward, algorithm, every config key as
/// an hparam), one entry per optimizer step with its metrics, and on the last step of each
/// iteration up to `max_prompts` logged groups with every response's tokens, log-probs
/// (`log_probs` at that step, `old_log_probs` from the rollout), advantages and per-token
/// objective; `ref_log_probs` where the run logged the reference's (null otherwise).
pub fn unipo(c: &RunConfig, records: &[StepRecord], max_prompts: usize) -> serde_json::Value {
    use serde_json::{Value, json};
    let entries: Vec<Value> = records
        .iter()
        .map(|r| {
            let mut entry = json!({
                "step": r.step.saturating_sub(1),
                "is_first_step_after_rollout_phase": r.step_in_iteration == 0,
                "metrics": unipo_metrics(c, r),
            });
            if let Some(groups) = &r.groups {
                entry["prompts"] = Value::Array(unipo_prompts(c, r, groups, max_prompts));
            }
            entry
        })
        .collect();
    json!({ "header": unipo_header(c, records), "entries": entries })
}

/// UNIPO's header: the task, the reward, the algorithm, every config key as an hparam.
fn unipo_header(c: &RunConfig, records: &[StepRecord]) -> serde_json::Value {
    use serde_json::{Value, json};
    let mut hparams = serde_json::Map::new();
    flatten(
        "",
        &serde_json::to_value(c).expect("a config serializes"),
        &mut hparams,
    );
    let model = format!(
        "grpo-lab {} (d_model {})",
        match c.model.kind {
            crate::config::ModelKind::Lecture => "lecture model",
            crate::config::ModelKind::Transformer => "transformer",
        },
        c.model.d_model
    );
    json!({
        "task": format!("sorting {} numbers from 0..{} (grpo-lab GRPO-SPEC §1)", c.task.n, c.task.vocab),
        "dataset": if c.task.prompts.is_empty() {
            format!("grpo-lab random prompts: {} train, {} held-out", c.task.train_size, c.task.heldout_size)
        } else {
            format!("grpo-lab fixed prompts: {:?}", c.task.prompts)
        },
        "reward_strategy": format!("rule-based verifier: {}", crate::task::RewardFn::from_task(&c.task).describe()),
        "algorithm": unipo_algorithm(c),
        "totalSteps": records.len(),
        "model_name": model,
        "reference_model_name": if c.algorithm.beta > 0.0 { Value::String(model.clone()) } else { Value::Null },
        "hparams": hparams,
    })
}

/// One step's metrics under UNIPO's names (and every CSV column as `grpo_lab/NAME`).
fn unipo_metrics(c: &RunConfig, r: &StepRecord) -> serde_json::Map<String, serde_json::Value> {
    use serde_json::json;
    let mut metrics = serde_json::Map::new();
    let mut put = |k: &str, v: f32| {
        metrics.insert(k.into(), json!(v));
    };
    put("policy_objective", -r.loss);
    put("reward", r.reward_mean);
    put("reward_std", r.reward_std);
    put("policy_loss", r.loss);
    put("total_loss", r.loss);
    put("entropy", r.entropy);
    put("kl", r.kl);
    put("clip_fraction", r.clip_ratio_low + r.clip_ratio_high);
    put("grad_norm", r.grad_norm);
    put("learning_rate", r.lr);
    put("response_length", r.mean_length);
    put("importance_sampling_ratio", r.ratio_mean);
    if c.algorithm.dynamic_sampling {
        put(
            "dynamic_sampling_pass_rate",
            100.0 * (1.0 - r.zero_std_first_draw),
        );
    }
    for (name, get) in CSV_COLUMNS {
        if let Some(v) = get(r) {
            metrics.insert(format!("grpo_lab/{name}"), json!(v));
        }
    }
    metrics
}

/// A step's logged groups: every response's tokens, log-probs, advantage and per-token
/// objective (the advantage mode that drives the update).
fn unipo_prompts(
    c: &RunConfig,
    r: &StepRecord,
    groups: &[crate::metrics::GroupRecord],
    max_prompts: usize,
) -> Vec<serde_json::Value> {
    use serde_json::{Value, json};
    let advantage_mode = c.algorithm.advantage.name();
    groups
        .iter()
        .take(max_prompts)
        .map(|g| {
            let adv = g.advantages.get(advantage_mode);
            let responses: Vec<Value> = g
                .responses
                .iter()
                .enumerate()
                .map(|(i, resp)| {
                    let a = adv.and_then(|v| v.get(i)).copied().unwrap_or(f32::NAN);
                    let logp = g.logp.get(i).cloned().unwrap_or_default();
                    let old = g.old_logp.get(i).cloned().unwrap_or_default();
                    // The reference's, where the run logged them (it computes them where
                    // a KL is measured or paid).
                    let reference = g
                        .ref_logp
                        .get(i)
                        .filter(|r| r.len() >= logp.len().min(old.len()));
                    let len = logp.len().min(old.len());
                    let (logp, old) = (&logp[..len], &old[..len]);
                    // The objective's own text; its KL term where the reference is logged.
                    let s = crate::objective::loss::LossSettings {
                        beta: if reference.is_some() {
                            c.algorithm.beta as f32
                        } else {
                            0.0
                        },
                        ..crate::objective::loss::LossSettings::of(c)
                    };
                    let ref_logp = reference.map_or(old, |r| &r[..len]);
                    let terms = crate::objective::loss::response_terms(&s, logp, old, ref_logp, a);
                    // −(ℓ_t + β·KL_t): the KL where the loss pays it (`kl_tokens` is logged
                    // either way, `term` holds ℓ_t alone).
                    let beta = if s.kl_on() { s.beta } else { 0.0 };
                    let objective: Vec<f32> = terms
                        .term
                        .iter()
                        .zip(terms.kl_tokens.iter().chain(std::iter::repeat(&0.0)))
                        .map(|(&l, &kl)| -(l + beta * kl))
                        .collect();
                    let strings: Vec<String> = resp.iter().map(|&t| token_string(t)).collect();
                    json!({
                        "id": format!("step{}_p{}_sample{i}", r.step - 1, g.prompt_index),
                        "reward": g.rewards.get(i),
                        "advantage": a,
                        "response_text": strings.join(" "),
                        "response_length": resp.len(),
                        "tokens": {
                            "ids": resp,
                            "strings": strings,
                            "log_probs": logp,
                            "old_log_probs": old,
                            "ref_log_probs": reference.is_some().then_some(ref_logp),
                            "advantages": vec![a; resp.len()],
                            "token_objective": objective,
                        },
                    })
                })
                .collect();
            json!({
                "prompt": g.prompt.iter().map(|&t| token_string(t)).collect::<Vec<_>>().join(" "),
                "responses": responses,
            })
        })
        .collect()
}

fn flatten(
    prefix: &str,
    v: &serde_json::Value,
    out: &mut serde_json::Map<String, serde_json::Value>,
) {
    match v {
        serde_json::Value::Object(m) if !prefix.ends_with("reward_weights") => {
            for (k, x) in m {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, x, out);
            }
        }
        other => {
            out.insert(prefix.to_string(), other.clone());
        }
    }
}

/// A log to export holds records, one per optimizer step in order: a repeated or backward
/// step (two logs joined, a copy) is an error; returns the steps missing between records
/// (lost lines), which export as they are.
pub fn check_steps(records: &[StepRecord]) -> Result<usize, String> {
    if records.is_empty() {
        return Err("no records to export".into());
    }
    let mut gaps = 0;
    for (k, pair) in records.windows(2).enumerate() {
        let (before, step) = (pair[0].step, pair[1].step);
        if step <= before {
            return Err(format!(
                "record {} is step {step} after step {before}: the log repeats or reorders steps (allowed: one record per step, in order)",
                k + 2
            ));
        }
        gaps += step - before - 1;
    }
    Ok(gaps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_crc_matches_tensorflow() {
        // TensorFlow's crc32c_test: crc32c("123456789") = 0xe3069283; masking rotates right by
        // 15 and adds 0xa282ead8.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        let c = 0xe306_9283u32;
        let rotated = (c >> 15) | ((c & 0x7fff) << 17);
        assert_eq!(masked_crc(b"123456789"), rotated.wrapping_add(0xa282_ead8));
    }

    #[test]
    fn a_zero_scalar_is_still_written() {
        let v = SummaryValue {
            tag: "kl".into(),
            value: Some(summary_value::Value::SimpleValue(0.0)),
        };
        let back = SummaryValue::decode(v.encode_to_vec().as_slice()).unwrap();
        assert_eq!(back, v);
        // tag (field 1, bytes) then simple_value (field 2, fixed32): 0x15.
        assert_eq!(v.encode_to_vec()[4], 0x15);
    }

    #[test]
    fn every_metric_has_a_tag_and_the_tags_are_distinct() {
        let runs = [KlRole::Loss, KlRole::Reward, KlRole::None]
            .into_iter()
            .flat_map(|kl| [false, true].map(|batch_std| LogContext { kl, batch_std }));
        for run in runs {
            for names in [Names::Trl, Names::Verl, Names::GrpoLab] {
                let mut tags: Vec<String> =
                    CSV_COLUMNS.iter().map(|(n, _)| run.tag(names, n)).collect();
                let n = tags.len();
                tags.sort();
                tags.dedup();
                assert_eq!(tags.len(), n, "{names:?} {run:?}");
            }
        }
        // TRL's reward_std follows the run's scale_rewards.
        let batch = LogContext {
            kl: KlRole::None,
            batch_std: true,
        };
        assert_eq!(batch.tag(Names::Trl, "reward/std"), "train/reward_std");
        assert_eq!(
            LogContext::default().tag(Names::Trl, "reward/group_std"),
            "train/reward_std"
        );
        for (m, _, _) in METRIC_NAMES {
            assert!(CSV_COLUMNS.iter().any(|(n, _)| n == m), "{m}");
        }
    }
}
