//! The config as TOML: `--set` assignments applied to a table, files parsed with their errors
//! located, layers merged key by key, and the key checks that name what is allowed.

use super::*;

/// Apply `key=value` assignments to a whole config's table. A bad key is refused with the
/// keys allowed there; a value of the wrong kind names its key (each assignment is
/// deserialized alone over the table as it was).
pub(super) fn apply_sets(table: &mut toml::Table, sets: &[String]) -> Result<(), ConfigError> {
    let reference = table.clone();
    // A type error is put on a set's key by trying that key alone over the table it came to;
    // where that table fails already (a config file's bad value), from_table names the key.
    let reference_reads = toml::Value::Table(reference.clone())
        .try_into::<RunConfig>()
        .is_ok();
    for assignment in sets {
        let (key, raw) = assignment
            .split_once('=')
            .ok_or_else(|| ConfigError::BadAssignment(assignment.clone()))?;
        let (key, raw) = (key.trim(), raw.trim());
        // TOML reads an integer past i64 as text: serde would say "invalid type: string".
        if let Some(toml::Value::Integer(_)) = get_path(&reference, key)
            && beyond_toml_int(raw)
        {
            return Err(beyond_toml_error(key, raw));
        }
        set_path(table, &reference, key, parse_value(raw))?;
    }
    for assignment in sets {
        let key = assignment
            .split_once('=')
            .map(|(k, _)| k.trim())
            .unwrap_or("");
        if let Some(v) = get_path(table, key).cloned() {
            if let (Some(toml::Value::Table(section)), false) =
                (get_path(&reference, key), v.is_table())
                && !FREE_MAPS.contains(&key)
            {
                let keys: Vec<String> = section.keys().map(|k| format!("{key}.{k}")).collect();
                let shown = keys.iter().take(6).cloned().collect::<Vec<_>>().join(", ");
                return bad(
                    key,
                    format!(
                        "a section, not a value: set one of its {} keys ({shown}{}; `grpo-lab config-docs` lists them)",
                        keys.len(),
                        if keys.len() > 6 { ", …" } else { "" }
                    ),
                );
            }
            if !reference_reads {
                continue;
            }
            let mut probe = reference.clone();
            set_path(&mut probe, &reference, key, v)?;
            toml::Value::Table(probe)
                .try_into::<RunConfig>()
                .map_err(|e| ConfigError::InvalidValue {
                    key: key.into(),
                    reason: with_allowed(key, e.message().to_string()),
                })?;
        }
    }
    Ok(())
}

/// The error of a field with a value it does not allow.
pub(super) fn bad(key: &str, reason: String) -> Result<(), ConfigError> {
    Err(ConfigError::InvalidValue {
        key: key.into(),
        reason,
    })
}

/// A config file's text (or a preset's) as a table. A syntax error says where it is (toml's
/// `message()` alone said "duplicate key" with no line); an integer literal beyond TOML's i64
/// is put on its key with the key's allowed values, as `--set` does.
pub(super) fn parse_toml(text: &str, origin: &str) -> Result<toml::Table, ConfigError> {
    toml::from_str(text).map_err(|e| {
        oversized_in_file(text, &e).unwrap_or_else(|| ConfigError::Parse {
            path: origin.into(),
            reason: located(text, &e),
        })
    })
}

/// toml's reason with its place on one line: "duplicate key at line 3, column 1: `n = 4`"
/// (its `Display` spends five lines on a caret drawing).
pub(super) fn located(text: &str, e: &toml::de::Error) -> String {
    let Some(before) = e.span().and_then(|span| text.get(..span.start)) else {
        return e.message().to_string();
    };
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line_no = before.matches('\n').count() + 1;
    let column = before[line_start..].chars().count() + 1;
    let line = text[line_start..].lines().next().unwrap_or("").trim_end();
    // A control character (a binary file's) shown escaped, not written to the terminal.
    let mut shown: String = line
        .chars()
        .take(80)
        .map(|c| match c.is_control() {
            true => c.escape_default().to_string(),
            false => c.to_string(),
        })
        .collect();
    if line.chars().count() > 80 {
        shown.push('…');
    }
    let at = format!("{} at line {line_no}, column {column}", e.message());
    if shown.trim().is_empty() {
        at
    } else {
        format!("{at}: `{shown}`")
    }
}

/// Stands in for an oversized integer literal while the file is read again to find its key.
const OVERSIZED: &str = "grpo-lab marker: an integer beyond i64";

/// Whether `s` is a decimal integer literal (sign, digits, `_`) that TOML's i64 cannot hold.
pub(super) fn beyond_toml_int(s: &str) -> bool {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    !digits.is_empty()
        && digits.chars().all(|c| c.is_ascii_digit() || c == '_')
        && digits.chars().any(|c| c.is_ascii_digit())
        && s.replace('_', "").parse::<i64>().is_err()
}

/// The key of an integer literal toml refused as too large (a seed above i64::MAX), found by
/// reading the text again with the literal replaced by a marker string.
pub(super) fn oversized_in_file(text: &str, e: &toml::de::Error) -> Option<ConfigError> {
    let span = e.span()?;
    let literal = text.get(span.clone())?.trim();
    if !beyond_toml_int(literal) {
        return None;
    }
    let marked = format!(
        "{}\"{OVERSIZED}\"{}",
        &text[..span.start],
        &text[span.end..]
    );
    let table: toml::Table = toml::from_str(&marked).ok()?;
    let key = marker_key(&table, "")?;
    Some(beyond_toml_error(&key, literal))
}

/// The dotted key whose value holds the [`OVERSIZED`] marker (an array counts as its key).
pub(super) fn marker_key(table: &toml::Table, prefix: &str) -> Option<String> {
    fn holds(v: &toml::Value) -> bool {
        match v {
            toml::Value::String(s) => s == OVERSIZED,
            toml::Value::Array(a) => a.iter().any(holds),
            toml::Value::Table(t) => t.values().any(holds),
            _ => false,
        }
    }
    table.iter().find_map(|(k, v)| match v {
        toml::Value::Table(sub) => marker_key(sub, &dotted(prefix, k)),
        v if holds(v) => Some(dotted(prefix, k)),
        _ => None,
    })
}

/// An integer past TOML's i64 (a file's literal, or a `--set` that TOML read as text), named
/// by its key with the key's allowed values (`run.seed`: 0..=9223372036854775807).
pub(super) fn beyond_toml_error(key: &str, literal: &str) -> ConfigError {
    let allowed = field_info(key)
        .map(|f| format!("; allowed {}", f.allowed()))
        .unwrap_or_default();
    ConfigError::InvalidValue {
        key: key.into(),
        reason: format!(
            "{literal} is out of range (a TOML integer lies in {}..={}){allowed}",
            i64::MIN,
            i64::MAX
        ),
    }
}

pub(super) fn parse_value(raw: &str) -> toml::Value {
    // A TOML literal if it parses as one (numbers, booleans, arrays, inline tables), else a string.
    let doc = format!("v = {raw}");
    match toml::from_str::<toml::Table>(&doc) {
        Ok(mut t) => t.remove("v").unwrap_or(toml::Value::String(raw.into())),
        Err(_) => toml::Value::String(raw.to_string()),
    }
}

pub(super) fn allowed_keys(table: &toml::Table, prefix: &str) -> String {
    table
        .keys()
        .map(|k| {
            if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Keys whose values are free-form maps (any key allowed).
pub(super) const FREE_MAPS: &[&str] = &["task.reward_weights"];

pub(super) fn check_keys(
    table: &toml::Table,
    reference: &toml::Table,
    prefix: &str,
) -> Result<(), ConfigError> {
    for (key, value) in table {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        let Some(ref_value) = reference.get(key) else {
            return Err(ConfigError::UnknownKey {
                key: path,
                allowed: allowed_keys(reference, prefix),
            });
        };
        if FREE_MAPS.contains(&path.as_str()) {
            continue;
        }
        match (value, ref_value) {
            (toml::Value::Table(sub), toml::Value::Table(ref_sub)) => {
                check_keys(sub, ref_sub, &path)?
            }
            (other, toml::Value::Table(ref_sub)) => {
                return Err(not_a_section(&path, ref_sub, other));
            }
            _ => {}
        }
    }
    Ok(())
}

/// A section of the config given a value (`task = 3`, or `[[task]]`, an array of tables):
/// serde's reason named a Rust type ("expected struct TaskConfig", or "expected usize" for the
/// array it read as a tuple), so this says what the key is and lists its keys.
pub(super) fn not_a_section(key: &str, section: &toml::Table, got: &toml::Value) -> ConfigError {
    let got = match got {
        toml::Value::Array(_) => format!("an array (`[[{key}]]` or `{key} = [...]` makes one)"),
        other => format!("the {} `{other}`", other.type_str()),
    };
    ConfigError::InvalidValue {
        key: key.into(),
        reason: format!(
            "a section (one table, `[{key}]` with `key = value` lines under it), not {got}; allowed keys in it: {}",
            allowed_keys(section, key)
        ),
    }
}

/// Every leaf key of a config table, dotted (free-form maps count as one leaf).
pub(super) fn leaf_keys(table: &toml::Table, prefix: &str, out: &mut Vec<String>) {
    for (k, v) in table {
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            toml::Value::Table(sub) if !FREE_MAPS.contains(&path.as_str()) => {
                leaf_keys(sub, &path, out)
            }
            _ => out.push(path),
        }
    }
}

/// The value at a dotted key of `table`, replaced as written (`set_path` converts it as
/// `--set` does); nothing where a section on the way is missing.
pub(super) fn put_path(table: &mut toml::Table, parts: &[&str], v: toml::Value) {
    match parts {
        [last] => {
            table.insert(last.to_string(), v);
        }
        [first, rest @ ..] => {
            if let Some(toml::Value::Table(sub)) = table.get_mut(*first) {
                put_path(sub, rest, v);
            }
        }
        [] => {}
    }
}

/// A leaf of `table` (its dotted key) that does not deserialize when set alone over
/// `reference` (the defaults), with serde's reason.
pub(super) fn first_bad_leaf(
    table: &toml::Table,
    reference: &toml::Table,
) -> Option<(String, String)> {
    let mut keys = Vec::new();
    leaf_keys(table, "", &mut keys);
    keys.into_iter().find_map(|key| {
        let mut probe = reference.clone();
        let parts: Vec<&str> = key.split('.').collect();
        put_path(&mut probe, &parts, get_path(table, &key)?.clone());
        let e = toml::Value::Table(probe).try_into::<RunConfig>().err()?;
        let reason = with_allowed(&key, e.message().to_string());
        Some((key, reason))
    })
}

/// serde's reason for a value of `key` it could not read, with the field's allowed values
/// (serde names the Rust type: "expected usize").
pub(super) fn with_allowed(key: &str, mut reason: String) -> String {
    if let Some(f) = FIELDS.iter().find(|f| f.key == key)
        && !reason.contains("expected one of")
    {
        reason.push_str(&format!("; allowed {}", f.allowed()));
    }
    reason
}

/// `over`'s keys into `base`, section by section, key by key; arrays and free maps
/// ([`FREE_MAPS`]) are values and replace `base`'s whole (see [`RunConfig::layered`] for why).
pub(super) fn merge(base: &mut toml::Table, over: toml::Table) {
    merge_at(base, over, "");
}

/// [`merge`] of the section at dotted `prefix` ("" at the top).
pub(super) fn merge_at(base: &mut toml::Table, over: toml::Table, prefix: &str) {
    for (k, v) in over {
        let path = dotted(prefix, &k);
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o))
                if !FREE_MAPS.contains(&path.as_str()) =>
            {
                merge_at(b, o, &path)
            }
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// `prefix.key`, or `key` at the top.
pub(super) fn dotted(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

/// The value at a dotted key of a config table.
pub fn get_path<'a>(table: &'a toml::Table, key: &str) -> Option<&'a toml::Value> {
    let mut parts = key.split('.');
    let mut cur = table.get(parts.next()?)?;
    for p in parts {
        cur = cur.as_table()?.get(p)?;
    }
    Some(cur)
}

pub(super) fn set_path(
    table: &mut toml::Table,
    reference: &toml::Table,
    key: &str,
    value: toml::Value,
) -> Result<(), ConfigError> {
    let parts: Vec<&str> = key.split('.').collect();
    let mut cur = table;
    let mut cur_ref = reference;
    let mut free = false;
    for (i, part) in parts.iter().enumerate() {
        let prefix = parts[..i].join(".");
        let last = i + 1 == parts.len();
        if !free && !cur_ref.contains_key(*part) {
            return Err(ConfigError::UnknownKey {
                key: key.into(),
                allowed: allowed_keys(cur_ref, &prefix),
            });
        }
        if last {
            let mut value = value;
            // Keep the value's type where TOML would read a bare word differently
            // (e.g. `run.name=123` stays a string).
            if let Some(toml::Value::String(_)) = cur_ref.get(*part)
                && !value.is_str()
            {
                value = toml::Value::String(value.to_string());
            }
            if let (Some(toml::Value::Float(_)), toml::Value::Integer(i)) =
                (cur_ref.get(*part), &value)
            {
                value = toml::Value::Float(*i as f64);
            }
            cur.insert(part.to_string(), value);
            return Ok(());
        }
        let path_so_far = parts[..=i].join(".");
        if FREE_MAPS.contains(&path_so_far.as_str()) {
            free = true;
        }
        let entry = cur
            .entry(part.to_string())
            .or_insert_with(|| toml::Value::Table(Default::default()));
        let Some(next) = entry.as_table_mut() else {
            return Err(ConfigError::UnknownKey {
                key: key.into(),
                allowed: format!("`{path_so_far}` is a value, not a section"),
            });
        };
        cur = next;
        if !free {
            cur_ref = cur_ref
                .get(*part)
                .and_then(|v| v.as_table())
                .expect("checked above");
        }
    }
    Ok(())
}
