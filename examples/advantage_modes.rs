//! Every advantage mode on a few hand-made groups, the way the lecture walks through them.
//!
//! `cargo run --release --example advantage_modes`

use grpo_lab::config::AdvantageMode;
use grpo_lab::objective::advantage::all_advantages;

fn main() {
    let groups: [(&str, Vec<f32>); 4] = [
        ("a spread of rewards", vec![1.0, 2.0, 2.0, 5.0]),
        (
            "one success among failures (sparse reward)",
            vec![0.0, 0.0, 0.0, 1.0],
        ),
        ("all equal: no learning signal", vec![3.0, 3.0, 3.0, 3.0]),
        (
            "nearly equal: std normalisation blows it up",
            vec![3.0, 3.0, 3.0, 3.01],
        ),
    ];
    for (what, rewards) in groups {
        let all = all_advantages(&rewards, rewards.len());
        let s = all.groups[0];
        println!(
            "\n{what}: rewards {rewards:?} (mean {:.3}, std {:.4})",
            s.mean, s.std
        );
        for m in AdvantageMode::GROUP {
            let v: Vec<String> = all.by_mode[m.name()]
                .iter()
                .map(|x| format!("{x:+8.3}"))
                .collect();
            println!("  {:>17}: {}", m.name(), v.join(" "));
        }
    }
    println!(
        "\nNote the last group: a 0.01 difference becomes advantages of about ±1.5 under `normalized` —"
    );
    println!(
        "GRPO's std division weighs nearly-solved (or nearly-hopeless) prompts as much as informative ones."
    );
}
