//! The exported reward module (`reward.py`): the sorting task's three verifiers with the
//! configured weights, reading a text answer the way grpo-lab's tokenizer does, with each
//! framework's signature. Its logic is held to grpo-lab's by [`cases`]: the table of worked
//! values the module's doctests check, computed here by the task's own verifiers.

use crate::config::{RewardKind, RunConfig};
use crate::task::reward;
use crate::task::tokenizer::{EOS, MAX_NUMBERS, PAD, PAD_ID, UNK_ID};

/// A text answer as grpo-lab's sorting tokenizer reads it (a WordLevel vocabulary over
/// whitespace-separated words): `"0".."1023"` are those numbers, `<pad>` is the pad token,
/// any other word is `<unk>` (id 1026, never a prompt number); the answer ends at the first
/// `<eos>`. Returns the answer's tokens and whether it was closed by `<eos>`.
pub fn parse_answer(text: &str) -> (Vec<u32>, bool) {
    let mut tokens = Vec::new();
    for word in text.split_whitespace() {
        if word == EOS {
            return (tokens, true);
        }
        tokens.push(token_id(word));
    }
    (tokens, false)
}

fn token_id(word: &str) -> u32 {
    if word == PAD {
        return PAD_ID;
    }
    // The vocabulary holds "0".."1023" written plainly: no sign, no leading zero.
    let plain = !word.is_empty()
        && word.bytes().all(|b| b.is_ascii_digit())
        && (word == "0" || !word.starts_with('0'));
    match word.parse::<u32>() {
        Ok(k) if plain && k < MAX_NUMBERS => k,
        _ => UNK_ID,
    }
}

/// One worked case: a prompt, a text answer, and what grpo-lab's verifiers give for it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Case {
    pub prompt: Vec<u32>,
    pub answer: String,
    pub tokens: Vec<u32>,
    pub distance: u32,
    pub inclusion_ordering: u32,
    pub exact: u32,
    /// The configured weighted sum (format reward included), as `{:.4}` text.
    pub score: String,
}

/// The table: the spec's worked values (GRPO-SPEC §1), then what text parsing must get
/// right (extra words, `<eos>`, commas, leading zeros, reward hacking, empty answers).
pub fn cases(c: &RunConfig) -> Vec<Case> {
    const P: &[u32] = &[3, 1, 0, 2];
    let table: &[(&[u32], &str)] = &[
        (P, "0 1 2 3"),
        (P, "7 2 2 5"),
        (P, "0 3 1 2"),
        (P, "0 0 0 0"),
        (P, "  0 1\n2 3 <eos> 9 9"),
        (P, "0, 1, 2, 3"),
        (P, "00 1 2 3"),
        (P, "The answer: 0 1 2 3"),
        (P, "0 1 2 3 4"),
        (P, ""),
        (&[1, 0, 2], "0 1 2"),
        (&[2, 2, 0], "0 2 2"),
        (&[2, 2, 0], "2 2 2"),
    ];
    let w = super::plan::verifier_weights(c);
    let fmt = super::plan::format_reward(c);
    table
        .iter()
        .map(|(prompt, answer)| {
            let (tokens, _) = parse_answer(answer);
            let v = |k| reward::value(k, prompt, &tokens) as u32;
            let (d, io, e) = (
                v(RewardKind::Distance),
                v(RewardKind::InclusionOrdering),
                v(RewardKind::Exact),
            );
            let mut score = w[0] * d as f64 + w[1] * io as f64 + w[2] * e as f64;
            if fmt != 0.0 && well_formed(&tokens) {
                score += fmt;
            }
            Case {
                prompt: prompt.to_vec(),
                answer: answer.to_string(),
                tokens,
                distance: d,
                inclusion_ordering: io,
                exact: e,
                score: format!("{score:.4}"),
            }
        })
        .collect()
}

/// The format reward's test on text: a non-empty answer of number words only.
fn well_formed(tokens: &[u32]) -> bool {
    !tokens.is_empty() && tokens.iter().all(|&t| t < MAX_NUMBERS)
}

fn py_list(v: &[u32]) -> String {
    format!(
        "[{}]",
        v.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// The text of `reward.py`.
pub fn module(c: &RunConfig, header: &str) -> String {
    let w = super::plan::verifier_weights(c);
    let fmt = super::plan::format_reward(c);
    let float = super::value::float;
    let mut doctests = String::new();
    for case in cases(c) {
        let answer = serde_json::to_string(&case.answer).expect("a string serializes");
        doctests.push_str(&format!(
            "    >>> verifiers({}, {answer})\n    ({}, {}, {})\n    >>> \"%.4f\" % score({}, {answer})\n    '{}'\n",
            py_list(&case.prompt),
            case.distance,
            case.inclusion_ordering,
            case.exact,
            py_list(&case.prompt),
            case.score,
        ));
    }
    let mut out = String::new();
    out.push_str(&format!(
        r#"# {header}
"""The sorting task's reward (grpo-lab GRPO-SPEC §1) for TRL, verl and OpenRLHF.

An answer is text; it is read the way grpo-lab's sorting tokenizer reads it: words separated
by whitespace, "0".."1023" are numbers, any other word is an unknown token (never a prompt
number), and the answer ends at the first "<eos>" if one is written. The truth is the sorted
prompt (the `ground_truth` column, e.g. "0 1 2 3").

  distance            positions where the answer equals sorted(prompt)
  inclusion_ordering  prompt numbers found in the answer (each occurrence counted)
                      + adjacent non-decreasing pairs of the answer
  exact               1 if the answer is sorted(prompt), else 0

The reward is WEIGHTS · (distance, inclusion_ordering, exact) (+ FORMAT_REWARD when every
word is a number). Check it against `grpo-lab score`:  python3 -m doctest reward.py -v
"""

WEIGHTS = {{"distance": {wd}, "inclusion_ordering": {wio}, "exact": {we}}}
FORMAT_REWARD = {fmt}
MAX_NUMBERS = {max_numbers}
PAD_ID = {pad}
UNK_ID = {unk}
_VOCAB = {{str(k): k for k in range(MAX_NUMBERS)}}


def parse_answer(text):
    """The answer's tokens and whether "<eos>" closed it.

    >>> parse_answer("0 1 2 3")
    ([0, 1, 2, 3], False)
    >>> parse_answer(" 2 x 07 <eos> 9")
    ([2, {unk}, {unk}], True)
    """
    tokens = []
    for word in text.split():
        if word == "<eos>":
            return tokens, True
        if word == "<pad>":
            tokens.append(PAD_ID)
        else:
            tokens.append(_VOCAB.get(word, UNK_ID))
    return tokens, False


def numbers(text):
    """A list of numbers from "3 1 0 2" (or a list already)."""
    if isinstance(text, (list, tuple)):
        return [int(x) for x in text]
    return [int(x) for x in str(text).replace(",", " ").split()]


def distance(truth, answer):
    return sum(1 for t, r in zip(truth, answer) if t == r)


def inclusion_ordering(prompt, answer):
    inclusion = sum(1 for x in prompt if x in answer)
    ordering = sum(1 for a, b in zip(answer, answer[1:]) if a <= b)
    return inclusion + ordering


def exact(truth, answer):
    return 1 if list(answer) == list(truth) else 0


def verifiers(prompt, text):
    r"""(distance, inclusion_ordering, exact) of a text answer, as `grpo-lab score` gives them.

    The worked values of GRPO-SPEC §1 and the parsing cases (the same table is
    reward_cases.json; grpo-lab's tests compute it with its own verifiers):

{doctests}    """
    truth = sorted(numbers(prompt))
    answer, _ = parse_answer(text)
    return distance(truth, answer), inclusion_ordering(truth, answer), exact(truth, answer)


def score(prompt, text):
    """The configured reward of a text answer (the prompt or its sorted truth: same result)."""
    d, io, e = verifiers(prompt, text)
    total = WEIGHTS["distance"] * d + WEIGHTS["inclusion_ordering"] * io + WEIGHTS["exact"] * e
    answer, _ = parse_answer(text)
    if FORMAT_REWARD and answer and all(t < MAX_NUMBERS for t in answer):
        total += FORMAT_REWARD
    return float(total)


def max_score(n):
    """The largest reward for a prompt of n numbers (OpenRLHF's scores are reward / this)."""
    best = (max(WEIGHTS["distance"], 0.0) * n + max(WEIGHTS["inclusion_ordering"], 0.0) * (2 * n - 1)
            + max(WEIGHTS["exact"], 0.0) + max(FORMAT_REWARD, 0.0))
    return best if best > 0 else 1.0


def _text(completion):
    # TRL gives a string (standard format) or a list of messages (conversational format).
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion:
        return completion[-1].get("content", "")
    return str(completion)


# ---- TRL: reward_funcs=[...] take (prompts, completions, **kwargs) and return floats; the
# dataset's ground_truth column arrives as a keyword argument.

def distance_reward(prompts, completions, ground_truth, **kwargs):
    return [float(verifiers(gt, _text(c))[0]) for c, gt in zip(completions, ground_truth)]


def inclusion_ordering_reward(prompts, completions, ground_truth, **kwargs):
    return [float(verifiers(gt, _text(c))[1]) for c, gt in zip(completions, ground_truth)]


def exact_reward(prompts, completions, ground_truth, **kwargs):
    return [float(verifiers(gt, _text(c))[2]) for c, gt in zip(completions, ground_truth)]


def format_reward(prompts, completions, ground_truth, **kwargs):
    out = []
    for c in completions:
        answer, _ = parse_answer(_text(c))
        out.append(1.0 if answer and all(t < MAX_NUMBERS for t in answer) else 0.0)
    return out


# The order of GRPOConfig(reward_weights=[...]).
REWARD_FUNCS = [distance_reward, inclusion_ordering_reward, exact_reward] + ([format_reward] if FORMAT_REWARD else [])
REWARD_WEIGHTS = [WEIGHTS["distance"], WEIGHTS["inclusion_ordering"], WEIGHTS["exact"]] + ([FORMAT_REWARD] if FORMAT_REWARD else [])


# ---- verl: custom_reward_function.name=compute_score

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """verl's signature; a dict with "score" plus the three verifiers for its logs.

    >>> compute_score("grpo-lab/sort", "0 1 2 3", "0 1 2 3")["score"] == score([0, 1, 2, 3], "0 1 2 3")
    True
    """
    d, io, e = verifiers(ground_truth, solution_str)
    return {{"score": score(ground_truth, solution_str), "distance": float(d),
            "inclusion_ordering": float(io), "exact": float(e)}}


# ---- OpenRLHF: --reward.remote_url reward.py loads reward_func(queries, prompts, labels)

def reward_func(queries, prompts, labels, **kwargs):
    """OpenRLHF's signature: a query is the prompt followed by the answer."""
    import torch

    rewards, scores, exacts = [], [], []
    for query, prompt, label in zip(queries, prompts, labels):
        text = query[len(prompt):] if query.startswith(prompt) else query
        r = score(label, text)
        rewards.append(r)
        scores.append(r / max_score(len(numbers(label))))
        exacts.append(float(verifiers(label, text)[2]))
    return {{
        "rewards": torch.tensor(rewards, dtype=torch.float32),
        "scores": torch.tensor(scores, dtype=torch.float32),
        "extra_logs": {{"exact_match": torch.tensor(exacts, dtype=torch.float32)}},
    }}


if __name__ == "__main__":
    import doctest

    failures, tests = doctest.testmod()
    print("%d doctests, %d failures" % (tests, failures))
    raise SystemExit(1 if failures else 0)
"#,
        wd = float(w[0]),
        wio = float(w[1]),
        we = float(w[2]),
        fmt = float(fmt),
        max_numbers = MAX_NUMBERS,
        pad = PAD_ID,
        unk = UNK_ID,
    ));
    out
}
