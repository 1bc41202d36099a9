//! Monospace lines that change every frame (the status line, a token row's reward and
//! advantage, the formula card's numbers) drawn from pieces whose text layouts repeat: each
//! digit alone, the rest in runs ending at a space. egui lays out a text it has not seen this
//! frame from scratch (shaping, a shaping plan per call); a line of fresh numbers then costs a
//! whole layout every frame, while its pieces are the same ten digits and the same words —
//! cached. In a monospace font every glyph advances the same, so the pieces side by side read
//! exactly as the whole line would.

use egui::{Color32, Galley, RichText, TextStyle};
use std::sync::Arc;

/// How a line looks: its text style, and a colour (`None`: the panel's text colour).
#[derive(Clone, Copy, Debug)]
pub struct Look {
    pub small: bool,
    pub colour: Option<Color32>,
}

impl Look {
    pub const PLAIN: Look = Look {
        small: false,
        colour: None,
    };
}

/// The pieces of `text`: every ASCII digit alone, the rest in runs that end after a space.
pub fn pieces(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, c) in text.char_indices() {
        let end = i + c.len_utf8();
        if c.is_ascii_digit() {
            if start < i {
                out.push(&text[start..i]);
            }
            out.push(&text[i..end]);
            start = end;
        } else if c == ' ' {
            out.push(&text[start..end]);
            start = end;
        }
    }
    if start < text.len() {
        out.push(&text[start..]);
    }
    out
}

/// Items of `sizes` laid out left to right from x = `indent`, wrapping back to `indent` when
/// the next would pass `width` (one line high as the tallest item, `line_gap` between lines),
/// `gap(k)` after item k: each item's rectangle (from the origin) and the whole size.
pub fn flow(
    sizes: &[egui::Vec2],
    width: f32,
    indent: f32,
    line_gap: f32,
    gap: impl Fn(usize) -> f32,
) -> (Vec<egui::Rect>, egui::Vec2) {
    let line_h = sizes.iter().map(|s| s.y).fold(0.0, f32::max);
    let (mut x, mut y, mut widest) = (indent, 0.0_f32, 0.0_f32);
    let mut rects = Vec::with_capacity(sizes.len());
    for (k, s) in sizes.iter().enumerate() {
        if x > indent && x + s.x > width {
            (x, y) = (indent, y + line_h + line_gap);
        }
        rects.push(egui::Rect::from_min_size(
            egui::pos2(x, y),
            egui::vec2(s.x, line_h),
        ));
        widest = widest.max(x + s.x);
        x += s.x + gap(k);
    }
    (rects, egui::vec2(widest, y + line_h))
}

fn galley(ui: &egui::Ui, piece: &str, look: Look) -> Arc<Galley> {
    let mut rich = RichText::new(piece).monospace();
    if look.small {
        rich = rich.size(TextStyle::Small.resolve(ui.style()).size);
    }
    unwrapped(ui, rich, TextStyle::Monospace)
}

/// `rich` laid out on one line (`style` where it names none), through egui's galley cache.
pub fn unwrapped(ui: &egui::Ui, rich: RichText, style: TextStyle) -> Arc<Galley> {
    egui::WidgetText::from(rich).into_galley(
        ui,
        Some(egui::TextWrapMode::Extend),
        f32::INFINITY,
        style,
    )
}

/// `text` as a label in a monospace font, wrapped at the panel's width between pieces.
pub fn label(ui: &mut egui::Ui, text: &str, look: Look) -> egui::Response {
    let width = ui.available_width().max(1.0);
    let parts: Vec<Arc<Galley>> = pieces(text)
        .into_iter()
        .map(|p| galley(ui, p, look))
        .collect();
    let sizes: Vec<egui::Vec2> = parts.iter().map(|g| g.size()).collect();
    let (at, size) = flow(&sizes, width, 0.0, 0.0, |_| 0.0);
    let (rect, r) = ui.allocate_exact_size(size, egui::Sense::hover());
    r.widget_info(|| egui::WidgetInfo::labeled(egui::Role::Label, true, text));
    if ui.is_rect_visible(rect) {
        let colour = look.colour.unwrap_or_else(|| ui.visuals().text_color());
        let painter = ui.painter();
        for (g, at) in parts.into_iter().zip(at) {
            painter.galley(rect.min + at.min.to_vec2(), g, colour);
        }
    }
    r
}

/// `text` as one monospace line `width` points wide at most: cut at a piece with "…" where
/// it does not fit, the whole text on hover then (a line that changes length — the status —
/// then never wraps, and what is under it never jumps).
pub fn truncated(ui: &mut egui::Ui, text: &str, look: Look, width: f32) -> egui::Response {
    let parts: Vec<Arc<Galley>> = pieces(text)
        .into_iter()
        .map(|p| galley(ui, p, look))
        .collect();
    let ellipsis = galley(ui, "…", look);
    let line_h = parts
        .iter()
        .map(|g| g.size().y)
        .fold(ellipsis.size().y, f32::max);
    let total: f32 = parts.iter().map(|g| g.size().x).sum();
    let width = width.max(ellipsis.size().x);
    // The pieces that fit, with the ellipsis after them where some do not.
    let (shown, cut) = if total <= width {
        (parts.len(), false)
    } else {
        let mut x = ellipsis.size().x;
        let n = parts
            .iter()
            .take_while(|g| {
                x += g.size().x;
                x <= width
            })
            .count();
        (n, true)
    };
    let (rect, r) = ui.allocate_exact_size(egui::vec2(width, line_h), egui::Sense::hover());
    r.widget_info(|| egui::WidgetInfo::labeled(egui::Role::Label, true, text));
    if ui.is_rect_visible(rect) {
        let colour = look.colour.unwrap_or_else(|| ui.visuals().text_color());
        let painter = ui.painter();
        let mut x = rect.min.x;
        let cut_piece = cut.then_some(ellipsis);
        for g in parts.into_iter().take(shown).chain(cut_piece) {
            let w = g.size().x;
            painter.galley(egui::pos2(x, rect.min.y), g, colour);
            x += w;
        }
    }
    if cut {
        r.on_hover_ui(|ui| {
            ui.label(text);
        })
    } else {
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_split_digits_and_words_and_keep_every_character() {
        let line = "iteration 12/300 · r −0.5 A +1.25 |";
        let p = pieces(line);
        assert_eq!(p.concat(), line);
        assert_eq!(
            p,
            [
                "iteration ",
                "1",
                "2",
                "/",
                "3",
                "0",
                "0",
                " ",
                "· ",
                "r ",
                "−",
                "0",
                ".",
                "5",
                " ",
                "A ",
                "+",
                "1",
                ".",
                "2",
                "5",
                " ",
                "|"
            ]
        );
        assert!(pieces("").is_empty());
    }

    /// Items wrap back to the indent when the next would pass the width, one line apart.
    #[test]
    fn flow_wraps_at_the_width_back_to_the_indent() {
        let sizes = [
            egui::vec2(30.0, 10.0),
            egui::vec2(30.0, 12.0),
            egui::vec2(50.0, 10.0),
        ];
        let (rects, size) = flow(&sizes, 100.0, 10.0, 2.0, |k| if k == 0 { 0.0 } else { 5.0 });
        let at: Vec<(f32, f32)> = rects.iter().map(|r| (r.min.x, r.min.y)).collect();
        assert_eq!(at, [(10.0, 0.0), (40.0, 0.0), (10.0, 14.0)]);
        assert!(rects.iter().all(|r| r.height() == 12.0));
        assert_eq!(size, egui::vec2(70.0, 26.0));
    }
}
