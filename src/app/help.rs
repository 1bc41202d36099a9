//! What each live plot shows and how to read it (#28 §4): its definition (the title's hover),
//! and behind its "?" how to read it and what a healthy and an unhealthy curve look like.

/// One plot's explanation.
pub struct PlotHelp {
    /// The plot's id (as `small_plot` and the PNG button name it).
    pub id: &'static str,
    pub definition: &'static str,
    pub read: &'static str,
    pub healthy: &'static str,
    pub unhealthy: &'static str,
}

/// Every plot of the Plots tab.
pub const PLOTS: &[PlotHelp] = &[
    PlotHelp {
        id: "reward",
        definition: "Mean verifier reward of each iteration's rollouts (all B·G responses). The dashed line is the largest possible reward.",
        read: "The faint curve is the raw mean, the strong one its moving average (the smoothing slider). It is measured on the responses the policy sampled, at the sampling temperature — not greedy accuracy.",
        healthy: "Rises, then flattens near the dashed line; the gap to it is what is left to learn.",
        unhealthy: "Flat from the start (no group has a reward difference: see the no-signal plot); a rise then a fall (a too-large step, a KL spike, reward hacking); stuck at a plateau below the maximum with entropy near 0 (collapsed onto a wrong answer).",
    },
    PlotHelp {
        id: "groups",
        definition: "Every sampled response's reward, iteration by iteration. Where the prompts come back every iteration (a fixed prompt list), one colour per prompt (the inspector's first groups; every other prompt in grey); where each iteration draws new prompts, one colour per group slot (group #k: the inspector's group k of each iteration).",
        read: "Each column of dots is one iteration; a prompt's G dots spread vertically when its answers differ. GRPO learns only from that spread: a group whose G rewards are equal has all-zero advantages.",
        healthy: "Groups spread early (there is something to compare), then climb together to the top reward.",
        unhealthy: "Groups that are flat from the start (too hard or too easy: no learning signal), or that collapse to one value below the top (every response the same wrong answer).",
    },
    PlotHelp {
        id: "advantages",
        definition: "The latest iteration's group chosen in the inspector: the same G rewards under raw, centered, normalized, max, rloo and batch_normalized advantages, one cluster of bars per mode.",
        read: "Centered subtracts the group mean (bars sum to 0); normalized also divides by the group's std, so a group with tiny reward differences gets full-size advantages; rloo leaves each response out of its own baseline; raw has no baseline at all (every bar the sign of the reward).",
        healthy: "Centered modes put positive bars on the better answers and negative on the worse, summing to zero.",
        unhealthy: "All bars 0 (a flat group: no signal); normalized bars of ±1 from a reward difference of 0.001 (std normalisation amplifying noise: the std-blowup trap).",
    },
    PlotHelp {
        id: "length",
        definition: "Mean, min and max response length per iteration, and the mean length of correct and of wrong responses.",
        read: "The lecture model always answers n tokens (flat lines); the transformer stops at <eos>, so its lengths move. Compare the correct and wrong curves: the loss's aggregation decides which way length drifts.",
        healthy: "Lengths settle at the task's answer length; correct and wrong responses are about as long.",
        unhealthy: "Wrong responses growing longer (the sample-level loss's length bias, Dr. GRPO's point); max length pinned at task.max_len (truncated answers); lengths collapsing to 1 (answering <eos> at once).",
    },
    PlotHelp {
        id: "kl",
        definition: "Mean per-token KL estimate (the configured k1 / k2 / k3) from the reference policy; drops to 0 when the reference is refreshed.",
        read: "How far the policy has moved from its reference, in nats per token. With β > 0 it is also what the penalty pushes down. k3 is always ≥ 0; k1 can be negative on a batch.",
        healthy: "Grows slowly and smoothly while reward rises, bounded when β > 0.",
        unhealthy: "Spikes (a step that moved the policy far: lower the learning rate or clip); a steady climb with no reward gain (the policy drifting without learning); exactly 0 all along with β > 0 (the reference is the policy: the shared-reference bug).",
    },
    PlotHelp {
        id: "entropy",
        definition: "Mean entropy of the policy per response position (nats), and with an entropy bonus its coefficient.",
        read: "How random the sampler still is. The maximum is ln(vocab) (a uniform policy). It falls as the policy commits to answers; the covariance of log π with the advantage drives that fall (run.entropy_dynamics logs it).",
        healthy: "Falls gradually while the reward rises, and stays above 0 until the reward is near its top.",
        unhealthy: "Collapses to ~0 early with the reward still low (entropy collapse: every response identical, all advantages 0, learning stops); rising without bound (an entropy bonus too large).",
    },
    PlotHelp {
        id: "clip",
        definition: "Fraction of tokens whose ratio is clipped: low (ρ < 1−ε_low with A < 0) and high (ρ > 1+ε_high with A > 0).",
        read: "Clipped tokens contribute no gradient. It is 0 at the first of the μ steps (ρ = 1) and grows over the later ones as π moves away from π_old.",
        healthy: "A few percent: the trust region is active but most tokens still learn.",
        unhealthy: "Tens of percent (the step is too large for ε: lower the learning rate or μ); always 0 with μ > 1 (ε too wide to matter, or nothing moves).",
    },
    PlotHelp {
        id: "zero-std",
        definition: "Fraction of groups whose rewards are all equal (every centered advantage is 0 there), and greedy accuracy.",
        read: "Those groups give GRPO nothing to learn from: the fraction is the share of the batch spent for nothing. Dynamic sampling (DAPO) replaces them.",
        healthy: "Falls as the policy learns the hard prompts, then rises again only once every group answers correctly (solved).",
        unhealthy: "Near 1 from the start (the task is too hard or too easy for the policy: no signal); rising while accuracy stays low (entropy collapse: every group answering the same wrong answer).",
    },
];

/// The explanation of plot `id`.
pub fn of(id: &str) -> Option<&'static PlotHelp> {
    PLOTS.iter().find(|p| p.id == id)
}

/// A plot's title: its definition on hover, and a "?" that opens (and closes) how to read it.
pub fn title(ui: &mut egui::Ui, title: &str, id: &str) {
    let Some(h) = of(id) else {
        ui.label(egui::RichText::new(title).strong());
        return;
    };
    let key = egui::Id::NULL.with(("plot-help", id));
    let mut open = ui.data(|d| d.get_temp::<bool>(key).unwrap_or(false));
    ui.horizontal(|ui| {
        ui.label(egui::RichText::new(title).strong())
            .on_hover_text(h.definition);
        if ui
            .small_button("?")
            .on_hover_text("How to read this plot")
            .clicked()
        {
            open = !open;
        }
    });
    ui.data_mut(|d| d.insert_temp(key, open));
    if open {
        egui::Frame::group(ui.style()).show(ui, |ui| {
            ui.label(h.definition);
            for (head, text) in [
                ("How to read it", h.read),
                ("Healthy", h.healthy),
                ("Unhealthy", h.unhealthy),
            ] {
                ui.label(egui::RichText::new(head).strong());
                ui.label(text);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_plot_explains_itself_once() {
        for (i, p) in PLOTS.iter().enumerate() {
            assert!(PLOTS[..i].iter().all(|q| q.id != p.id), "{} twice", p.id);
            for text in [p.definition, p.read, p.healthy, p.unhealthy] {
                assert!(text.len() > 40, "{}: {text}", p.id);
            }
        }
    }
}
