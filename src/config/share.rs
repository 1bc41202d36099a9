//! Short shared configs: a one-line config (the app's "Copy as one line", a link's
//! `#grpo-lab:{…}`) may name a preset and give only what differs from it —
//! `{"preset":"transformer-sort","algorithm":{"loss":"clipped"}}`. The rest comes from the
//! preset: tables merge key by key, arrays (and free maps such as `task.reward_weights`)
//! replace. Without `preset`, the keys fill over the defaults, so a whole config (the long
//! form) reads as before. Unknown keys are refused by name, as in a TOML file.

use super::{ConfigError, FREE_MAPS, PRESETS, RunConfig, merge};

/// The key that names the preset a short config starts from.
const PRESET_KEY: &str = "preset";

impl RunConfig {
    /// A config from its one-line JSON form (long or short).
    pub fn from_json_line(json: &str) -> Result<Self, ConfigError> {
        let bad = ConfigError::SharedLine;
        let value: serde_json::Value = serde_json::from_str(json).map_err(|e| {
            bad(format!(
                "not valid JSON: {e} (a `%` written by hand must be `%25`)"
            ))
        })?;
        if value.as_object().is_none() {
            return Err(bad(
                "expected an object: {\"preset\": …, \"section\": {…}}".into()
            ));
        }
        let mut table: toml::Table =
            serde_json::from_value(value).map_err(|e| bad(format!("not a config table: {e}")))?;
        let base = match table.remove(PRESET_KEY) {
            None => return Self::from_table(table),
            Some(toml::Value::String(name)) => Self::preset(&name)?,
            Some(other) => {
                return Err(ConfigError::InvalidValue {
                    key: PRESET_KEY.into(),
                    reason: format!("{other} is not a preset name (a string)"),
                });
            }
        };
        let mut merged = toml::Table::try_from(&base).expect("config serializes");
        merge(&mut merged, table);
        Self::from_table(merged)
    }

    /// The one-line JSON form of this config: the preset nearest to it (fewest differing
    /// keys) and the keys that differ from it, which [`Self::from_json_line`] reads back to
    /// this very config.
    pub fn to_json_line(&self) -> String {
        let own = toml::Table::try_from(self).expect("config serializes");
        let (name, diff) = PRESETS
            .iter()
            .filter_map(|(name, _)| {
                let preset = Self::preset(name).ok()?;
                let base = toml::Table::try_from(&preset).expect("config serializes");
                Some((*name, differing(&base, &own, "")))
            })
            .min_by_key(|(_, diff)| leaves(diff))
            .expect("presets load");
        let mut line = toml::Table::new();
        line.insert(PRESET_KEY.into(), toml::Value::String(name.into()));
        line.extend(diff);
        serde_json::to_string(&line).expect("config serializes")
    }
}

/// The keys of `own` whose values differ from `base`'s, tables descended key by key (free
/// maps and arrays compared whole).
fn differing(base: &toml::Table, own: &toml::Table, prefix: &str) -> toml::Table {
    let mut out = toml::Table::new();
    for (k, v) in own {
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match (base.get(k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o))
                if !FREE_MAPS.contains(&path.as_str()) =>
            {
                let sub = differing(b, o, &path);
                if !sub.is_empty() {
                    out.insert(k.clone(), toml::Value::Table(sub));
                }
            }
            (Some(b), v) if b == v => {}
            (_, v) => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    out
}

/// How many values a (differing-keys) table sets.
fn leaves(t: &toml::Table) -> usize {
    t.values()
        .map(|v| match v {
            toml::Value::Table(sub) => leaves(sub),
            _ => 1,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A short line names a preset and what differs; it reads as the preset with those keys.
    #[test]
    fn a_short_line_is_its_preset_with_the_keys_it_gives() {
        let c = RunConfig::from_json_line(
            r#"{"preset":"transformer-sort","algorithm":{"loss":"clipped","mu":3}}"#,
        )
        .unwrap();
        let mut want = RunConfig::preset("transformer-sort").unwrap();
        want.algorithm.loss = super::super::LossMode::Clipped;
        want.algorithm.mu = 3;
        assert_eq!(c, want);
        // A preset alone, and the bare name a teacher writes by hand.
        let c = RunConfig::from_json_line(r#"{"preset":"lecture17"}"#).unwrap();
        assert_eq!(c, RunConfig::preset("lecture17").unwrap());
    }

    /// Every preset, and a config away from each, goes to a short line and back unchanged;
    /// the line is short and names the nearest preset.
    #[test]
    fn every_config_round_trips_through_its_short_line() {
        for (name, _) in PRESETS {
            let mut c = RunConfig::preset(name).unwrap();
            let line = c.to_json_line();
            assert_eq!(line, format!(r#"{{"preset":"{name}"}}"#));
            c.optimizer.lr *= 0.5;
            c.run.seed = 7;
            c.run.name = "mine".into();
            let line = c.to_json_line();
            assert!(line.len() < 200, "{line}");
            assert_eq!(RunConfig::from_json_line(&line).unwrap(), c, "{line}");
        }
    }

    /// The long form (a whole config) still reads; a section left out comes from the defaults.
    #[test]
    fn the_long_form_reads_and_sections_may_be_left_out() {
        let c = RunConfig::preset("scaled").unwrap();
        let long = serde_json::to_string(&c).unwrap();
        assert_eq!(RunConfig::from_json_line(&long).unwrap(), c);
        let partial = RunConfig::from_json_line(r#"{"run":{"seed":3}}"#).unwrap();
        assert_eq!(partial.run.seed, 3);
        assert_eq!(partial.model, RunConfig::default().model);
    }

    /// Unknown keys, unknown presets and bad values are refused by name.
    #[test]
    fn bad_lines_are_refused_by_name() {
        let e = |line: &str| RunConfig::from_json_line(line).unwrap_err().to_string();
        let msg = e(r#"{"preset":"lecture17","algorithm":{"lossy":"clipped"}}"#);
        assert!(msg.contains("algorithm.lossy"), "{msg}");
        let msg = e(r#"{"preset":"lecture99"}"#);
        assert!(
            msg.contains("lecture99") && msg.contains("lecture17"),
            "{msg}"
        );
        let msg = e(r#"{"preset":3}"#);
        assert!(msg.contains("preset"), "{msg}");
        let msg = e(r#"{"preset":"lecture17","algorithm":{"loss":"sideways"}}"#);
        assert!(msg.contains("sideways"), "{msg}");
        let msg = e("[1, 2]");
        assert!(msg.contains("object"), "{msg}");
    }
}
