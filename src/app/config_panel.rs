//! The config panel from the field table (#28 §6): every key of `config::FIELDS`, grouped by
//! section, each with its label, tooltip (help, allowed values, key) and a widget its range
//! picks — a checkbox, a number with its bounds, a menu of the allowed names, a text line; the
//! structured keys (prompt lists, reward weights) as one TOML value — plus a search box over
//! keys, labels and help. A key that does not apply to this config (its scope) is shown
//! greyed with the condition; a value the draft's validation refuses shows the reason under it.

use crate::config::{Bound, FIELDS, Field, Range, RunConfig, Scope, get_path as get};
use egui::RichText;

const ERROR: egui::Color32 = egui::Color32::from_rgb(200, 60, 60);

/// The panel's state: the search text, and the draft as a TOML table (rebuilt when the draft
/// changes, not every frame).
#[derive(Debug, Default)]
pub struct ConfigPanel {
    pub search: String,
    /// Open (or close) every section on the next frame.
    expand: Option<bool>,
    /// A drawn row's height: the rows scrolled out of view take this much space undrawn.
    row_h: f32,
    cached: Option<(RunConfig, toml::Table)>,
    /// The sections matching the search, for the search they match (it changes on typing).
    found: Option<(String, Vec<Section>)>,
    /// A typed value the draft cannot hold (a negative whole number where the field is
    /// unsigned): its key and the refusal, shown at the field until the field reads again.
    pub typed_error: Option<(String, String)>,
}

/// A section's name and its fields (those matching the search).
pub type Section = (&'static str, Vec<&'static Field>);

/// A section's title for the part of a key before its last dot.
fn section_title(section: &str) -> String {
    match section {
        "task" => "Task".into(),
        "model" => "Model".into(),
        "algorithm" => "Algorithm".into(),
        "algorithm.bugs" => "Bug gallery (deliberate bugs)".into(),
        "sampling" => "Sampling".into(),
        "optimizer" => "Optimizer".into(),
        "run" => "Run".into(),
        "sft" => "Cold start (SFT)".into(),
        other => other.into(),
    }
}

fn section_of(key: &str) -> &str {
    key.rsplit_once('.').map_or("", |(s, _)| s)
}

/// What the search reads of a field: key, label and help, lower-cased.
fn haystack(f: &Field) -> String {
    format!("{} {} {}", f.key, f.label, f.help).to_lowercase()
}

/// Whether a haystack holds every word of the (lower-cased) search.
fn matches_text(hay: &str, search_lower: &str) -> bool {
    search_lower.split_whitespace().all(|w| hay.contains(w))
}

/// The sections in the table's order, each with its fields matching `search`.
pub fn sections(search: &str) -> Vec<Section> {
    // Every field's haystack, lower-cased once per process (the panel searches every frame).
    static HAY: std::sync::LazyLock<Vec<String>> =
        std::sync::LazyLock::new(|| FIELDS.iter().map(haystack).collect());
    let search = search.to_lowercase();
    let mut out: Vec<Section> = Vec::new();
    let found = FIELDS
        .iter()
        .zip(HAY.iter())
        .filter(|(_, hay)| matches_text(hay, &search));
    for (f, _) in found {
        let s = section_of(f.key);
        match out.iter_mut().find(|(name, _)| *name == s) {
            Some((_, v)) => v.push(f),
            None => out.push((s, vec![f])),
        }
    }
    out
}

fn set(table: &mut toml::Table, key: &str, value: toml::Value) {
    let parts: Vec<&str> = key.split('.').collect();
    let mut t = table;
    for p in &parts[..parts.len() - 1] {
        let entry = t
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let Some(inner) = entry.as_table_mut() else {
            return;
        };
        t = inner;
    }
    t.insert(parts[parts.len() - 1].to_string(), value);
}

/// Every field of the draft, by section; edits go back into `draft` (when the edited table
/// still reads as a config). `error`: the key the draft's validation refuses, and why.
pub fn fields_ui(
    panel: &mut ConfigPanel,
    draft: &mut RunConfig,
    error: &Option<(String, String)>,
    ui: &mut egui::Ui,
) {
    ui.horizontal(|ui| {
        let l = ui.label("Search");
        // Right to left: the ✖ first, then the box takes exactly the width left. (A box sized
        // `available_width() - 30` with the ✖ after it overflowed the row by a few points, the
        // resizable panel took the overflow as its new width, and the next frame's box was
        // that much wider again: the panel grew on every frame while the search had text.)
        ui.with_layout(egui::Layout::right_to_left(egui::Align::Center), |ui| {
            if !panel.search.is_empty()
                && ui
                    .small_button("✖")
                    .on_hover_text("Clear the search")
                    .clicked()
            {
                panel.search.clear();
            }
            ui.add(
                egui::TextEdit::singleline(&mut panel.search)
                    .hint_text(format!("search {} keys", FIELDS.len()))
                    .desired_width(ui.available_width()),
            )
            .labelled_by(l.id);
        });
    });
    ui.horizontal(|ui| {
        if ui
            .small_button("⊞ all")
            .on_hover_text("Open every section")
            .clicked()
        {
            panel.expand = Some(true);
        }
        if ui
            .small_button("⊟ all")
            .on_hover_text("Close every section")
            .clicked()
        {
            panel.expand = Some(false);
        }
    });
    let expand = panel.expand.take();
    if panel.cached.as_ref().is_none_or(|(c, _)| c != draft) {
        let table = toml::Table::try_from(&*draft).unwrap_or_default();
        panel.cached = Some((draft.clone(), table));
        // A new draft (an edit that read, a preset, a file): a refused typed value is gone.
        panel.typed_error = None;
    }
    let Some((_, table)) = &mut panel.cached else {
        return;
    };
    let table = &mut *table;
    let searching = !panel.search.trim().is_empty();
    if panel.found.as_ref().is_none_or(|(s, _)| *s != panel.search) {
        panel.found = Some((panel.search.clone(), sections(&panel.search)));
    }
    let found = panel.found.as_ref().map_or(&[][..], |(_, f)| &f[..]);
    if found.is_empty() {
        ui.label(RichText::new("no key matches").weak());
    }
    let mut changed = None;
    let shown = panel.typed_error.clone().or_else(|| error.clone());
    for (section, fields) in found.iter().map(|(s, f)| (*s, f)) {
        let header =
            egui::CollapsingHeader::new(format!("{} ({})", section_title(section), fields.len()))
                .id_salt(section)
                .default_open(section == "algorithm");
        let header = match (searching, expand) {
            (true, _) => header.open(Some(true)),
            (false, e) => header.open(e),
        };
        header.show(ui, |ui| {
            for f in fields {
                if field_row(ui, table, f, draft, &shown, &mut panel.row_h) {
                    changed = Some(*f);
                }
            }
        });
    }
    if let Some(f) = changed {
        panel.typed_error = read_back(table, f, draft).err();
    }
}

/// The edited table into the draft. Not `from_table`: it validates, and an invalid draft must
/// reach the panel to be shown at its field. A value the draft's type cannot hold (a negative
/// G) is refused here, at field `f`, the one edited.
fn read_back(
    table: &mut toml::Table,
    f: &Field,
    draft: &mut RunConfig,
) -> Result<(), (String, String)> {
    match toml::Value::Table(table.clone()).try_into::<RunConfig>() {
        Ok(c) => {
            *draft = c;
            Ok(())
        }
        Err(_) => {
            let value = get(table, f.key).map_or(String::new(), |v| v.to_string());
            let why = format!(
                "invalid value for `{}`: {value} is out of range; allowed {}",
                f.key,
                f.allowed()
            );
            // The field shows the draft's value again, so the next edit of any field reads.
            let kept = toml::Table::try_from(&*draft).ok();
            if let Some(v) = kept.as_ref().and_then(|t| get(t, f.key)) {
                set(table, f.key, v.clone());
            }
            Err((f.key.to_string(), why))
        }
    }
}

/// One key's row: its label (tooltip), its widget, and the refusal under it. Whether it changed.
fn field_row(
    ui: &mut egui::Ui,
    table: &mut toml::Table,
    f: &Field,
    draft: &RunConfig,
    error: &Option<(String, String)>,
    row_h: &mut f32,
) -> bool {
    // A row out of view (the panel scrolls ~110 of them) takes its space undrawn: the panel's
    // cost per frame is that of the rows on screen.
    let refused = error.as_ref().is_some_and(|(k, _)| k == f.key);
    let guess = egui::Rect::from_min_size(
        ui.cursor().min,
        egui::vec2(ui.available_width(), row_h.max(1.0)),
    );
    if *row_h > 0.0 && !refused && !ui.is_rect_visible(guess) {
        ui.allocate_space(egui::vec2(0.0, *row_h));
        return false;
    }
    let applies = f.scope.applies(draft);
    let mut changed = false;
    let row = ui.horizontal(|ui| {
        // The tooltip's text is built only while it shows.
        let l = ui.label(f.label).on_hover_ui(|ui| {
            ui.label(f.tooltip());
        });
        // A scope (a child ui) only for the rows that do not apply: most rows are enabled.
        if applies {
            changed = widget(ui, table, f, l.id);
        } else {
            ui.add_enabled_ui(false, |ui| {
                changed = widget(ui, table, f, l.id);
            });
        }
        if !applies && f.scope != Scope::Always {
            ui.label(
                RichText::new(format!("(when {})", f.scope.words()))
                    .small()
                    .weak(),
            );
        }
    });
    *row_h = row.response.rect.height();
    if let Some((k, msg)) = error
        && k == f.key
    {
        ui.label(RichText::new(format!("✖ {msg}")).color(ERROR).small());
    }
    changed
}

/// The widget of one key, editing its value in `table`; whether it changed.
fn widget(ui: &mut egui::Ui, table: &mut toml::Table, f: &Field, label: egui::Id) -> bool {
    let Some(value) = get(table, f.key).cloned() else {
        ui.label(RichText::new("(not in this config)").weak());
        return false;
    };
    let new = match (&f.range, &value) {
        (Range::Bool, toml::Value::Boolean(b)) => {
            let mut b = *b;
            ui.checkbox(&mut b, "")
                .labelled_by(label)
                .changed()
                .then_some(toml::Value::Boolean(b))
        }
        (Range::Choice(names), toml::Value::String(s)) => {
            let mut s = s.clone();
            let r = egui::ComboBox::from_id_salt(f.key)
                .selected_text(s.as_str())
                .show_ui(ui, |ui| {
                    for n in *names {
                        ui.selectable_value(&mut s, n.to_string(), *n);
                    }
                })
                .response
                .labelled_by(label);
            let _ = r;
            (Some(s.as_str()) != value.as_str()).then_some(toml::Value::String(s))
        }
        (Range::Int { min, max }, toml::Value::Integer(i)) => {
            let mut v = *i;
            let hi = max.map_or(i64::MAX, |m| m.min(i64::MAX as u64) as i64);
            let r = ui.add(egui::DragValue::new(&mut v)).labelled_by(label);
            drag_clamped(&r, &mut v, *min as i64, hi);
            r.changed().then_some(toml::Value::Integer(v))
        }
        (Range::Float { low, high }, toml::Value::Float(x)) => {
            let mut v = *x;
            let lo = match low {
                Bound::Closed(b) => *b,
                _ => f64::NEG_INFINITY,
            };
            let hi = match high {
                Bound::Closed(b) => *b,
                _ => f64::INFINITY,
            };
            let speed = (v.abs() * 0.01).max(1e-4);
            let r = ui
                .add(
                    egui::DragValue::new(&mut v)
                        .speed(speed)
                        .custom_formatter(|x, _| float_text(x))
                        .custom_parser(|s| s.trim().parse().ok()),
                )
                .labelled_by(label);
            drag_clamped(&r, &mut v, lo, hi);
            r.changed().then_some(toml::Value::Float(v))
        }
        (_, toml::Value::String(s)) => {
            let mut s = s.clone();
            ui.add(egui::TextEdit::singleline(&mut s).desired_width(160.0))
                .labelled_by(label)
                .changed()
                .then_some(toml::Value::String(s))
        }
        // Lists and tables (prompts, reward weights): one TOML value, applied when it reads.
        _ => toml_line(ui, f.key, &value, label),
    };
    match new {
        Some(v) => {
            set(table, f.key, v);
            true
        }
        None => false,
    }
}

/// A number's range for its drag alone. A `DragValue`'s own `range` clamps typed text too: a
/// typed G = 0 became 1 without a word. Without it a typed value outside the range reaches the
/// draft, and the draft's validation refuses it at its field with the reason (as for any bad
/// value); a drag stays inside the range.
fn drag_clamped<T: PartialOrd + Copy>(r: &egui::Response, v: &mut T, lo: T, hi: T) {
    if r.changed() && r.dragged() {
        if *v < lo {
            *v = lo;
        } else if *v > hi {
            *v = hi;
        }
    }
}

/// A number as the config file would write it, short: `1e-8`, `0.0003`, `0.95`, `64`.
fn float_text(x: f64) -> String {
    if x != 0.0 && (x.abs() < 1e-3 || x.abs() >= 1e6) {
        format!("{x:e}")
    } else {
        let s = format!("{x:.6}");
        let s = s.trim_end_matches('0');
        s.strip_suffix('.')
            .map_or(s.to_string(), |i| format!("{i}.0"))
    }
}

/// A structured value as one line of TOML (kept in the ui's memory while it is edited); the
/// new value once the line reads as TOML.
fn toml_line(
    ui: &mut egui::Ui,
    key: &str,
    value: &toml::Value,
    label: egui::Id,
) -> Option<toml::Value> {
    let id = egui::Id::NULL.with(("toml line", key));
    let shown = value.to_string();
    let mut text: String = ui
        .data_mut(|d| d.get_temp(id))
        .unwrap_or_else(|| shown.clone());
    let r = ui
        .add(
            egui::TextEdit::singleline(&mut text)
                .code_editor()
                .desired_width(220.0),
        )
        .labelled_by(label);
    let parsed = toml::from_str::<toml::Table>(&format!("v = {text}"))
        .ok()
        .and_then(|mut t| t.remove("v"));
    if r.has_focus() {
        ui.data_mut(|d| d.insert_temp(id, text.clone()));
    } else {
        ui.data_mut(|d| d.remove::<String>(id));
    }
    if parsed.is_none() {
        ui.label(RichText::new("not TOML yet").small().color(ERROR));
    }
    parsed.filter(|p| r.changed() && p != value)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key of the table has a section and a value in the default config and in each
    /// preset (so every key gets a widget), and the search narrows by key, label or help.
    #[test]
    fn every_key_has_a_widget_and_search_narrows() {
        for preset in ["lecture17", "transformer-sort"] {
            let c = RunConfig::preset(preset).unwrap();
            let table = toml::Table::try_from(&c).unwrap();
            for f in FIELDS {
                assert!(
                    get(&table, f.key).is_some(),
                    "{preset}: {} has no value",
                    f.key
                );
            }
        }
        // Every row is found by its label: no two keys share one.
        let mut labels: Vec<&str> = FIELDS.iter().map(|f| f.label).collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), FIELDS.len(), "two keys share a label");
        let all: usize = sections("").iter().map(|(_, v)| v.len()).sum();
        assert_eq!(all, FIELDS.len());
        let gae = sections("gae");
        assert!(
            gae.iter()
                .any(|(_, v)| v.iter().any(|f| f.key == "algorithm.gamma"))
        );
        assert!(sections("zzzz-no-such-key").is_empty());
    }

    #[test]
    fn floats_read_as_the_file_writes_them() {
        assert_eq!(float_text(1e-8), "1e-8");
        assert_eq!(float_text(3e-4), "3e-4");
        assert_eq!(float_text(0.95), "0.95");
        assert_eq!(float_text(64.0), "64.0");
        assert_eq!(float_text(0.0), "0.0");
    }

    /// Setting a value through the table reads back as the config with that value.
    #[test]
    fn a_set_value_reads_back() {
        let c = RunConfig::preset("lecture17").unwrap();
        let mut table = toml::Table::try_from(&c).unwrap();
        set(
            &mut table,
            "algorithm.epsilon_high",
            toml::Value::Float(0.28),
        );
        set(
            &mut table,
            "algorithm.bugs.shared_reference",
            toml::Value::Boolean(true),
        );
        let back: RunConfig = toml::Value::Table(table).try_into().unwrap();
        assert_eq!(back.algorithm.epsilon_high, 0.28);
        assert!(back.algorithm.bugs.shared_reference);
    }
}
