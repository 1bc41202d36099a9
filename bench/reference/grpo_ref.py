"""The lecture's GRPO loop (CS336 lecture 17) written as vectorized PyTorch: no Python loop
over prompts, responses or positions. Run only by `grpo-lab bench --pytorch`, which hands it
the same initial weights and prompts as the Rust trainer and compares the two.

Input (JSON on the command line, a file): shape, weights, prompts, timing settings.
Output (JSON on stdout): greedy responses and rewards at init, and step times.
A spec with `"model": "transformer"` runs the transformer's loop instead (`transformer_ref.py`).
"""

import argparse
import json
import statistics
import time

import torch


def inclusion_ordering(prompts, responses):
    """prompts [B, n], responses [B, G, T] -> [B, G]: prompt numbers found + ordered pairs."""
    found = (prompts[:, None, :, None] == responses[:, :, None, :]).any(-1).sum(-1)
    ordered = (responses[:, :, 1:] >= responses[:, :, :-1]).sum(-1)
    return (found + ordered).float()


class Lecture(torch.nn.Module):
    def __init__(self, w, vocab, n, d):
        super().__init__()
        t = lambda x, *s: torch.nn.Parameter(torch.tensor(x, dtype=torch.float32).view(*s))
        self.embedding = t(w["embedding"], vocab, d)
        self.encode = t(w["encode"], n, d, d)
        self.decode = t(w["decode"], n, d, d)

    def forward(self, prompts):  # [B, n] -> [B, n, V]
        emb = self.embedding[prompts]
        enc = torch.einsum("bpd,pde->be", emb, self.encode)
        dec = torch.einsum("be,pef->bpf", enc, self.decode)
        return dec @ self.embedding.T


class LectureReordered(Lecture):
    """The same model with its products taken in grpo-lab's order (vocab << batch): the
    per-position tables T_p = E @ encode_p and M_p = decode_p @ E.T first, then a gather-sum
    and one product. Same function; timed only as a second reference point."""

    def forward(self, prompts):  # [B, n] -> [B, n, V]
        n, vocab = self.encode.shape[0], self.embedding.shape[0]
        t = torch.einsum("vd,pde->pve", self.embedding, self.encode)  # [n, V, D]
        enc = t[torch.arange(n)[None, :], prompts].sum(1)  # [B, D]
        m = torch.einsum("pef,vf->epv", self.decode, self.embedding)  # [D, n, V]
        return (enc @ m.reshape(m.shape[0], -1)).view(-1, n, vocab)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("input")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    spec = json.load(open(a.input))
    torch.set_num_threads(a.threads)
    if spec.get("model") == "transformer":
        from transformer_ref import run

        print(json.dumps(run(spec, a.threads)))
        return
    torch.manual_seed(spec["seed"])
    s = spec["shape"]
    vocab, n, d, g, mu, b = s["vocab"], s["n"], s["d_model"], s["num_generations"], s["mu"], s["prompts_per_iteration"]
    train = torch.tensor(spec["prompts"], dtype=torch.long)

    def timed(model):
        """Median [p10, p90] ms per optimizer step (its share of the rollout included)."""
        torch.manual_seed(spec["seed"])
        opt = torch.optim.Adam(model.parameters(), lr=spec["lr"], betas=(0.9, 0.999), eps=1e-8)

        def iteration():
            idx = torch.randperm(train.shape[0])[:b] if b < train.shape[0] else torch.arange(train.shape[0])
            prompts = train[idx]
            with torch.no_grad():
                probs = torch.softmax(model(prompts), -1)  # [B, n, V]
                responses = torch.multinomial(probs.reshape(-1, vocab), g, replacement=True)
                responses = responses.view(len(idx), n, g).permute(0, 2, 1)  # [B, G, n]
                rewards = inclusion_ordering(prompts, responses)
                adv = (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-5)
            index = responses.permute(0, 2, 1)  # [B, n, G]
            for _ in range(mu):
                logp = torch.log_softmax(model(prompts), -1).gather(2, index)  # [B, n, G]
                loss = -(adv[:, None, :] * logp).mean()  # naive loss, fixed lengths
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            return rewards.mean().item()

        first = time.perf_counter()
        iteration()
        first_ms = (time.perf_counter() - first) * 1000
        for _ in range(spec.get("warmup", 2)):
            iteration()
        per_step = []
        for _ in range(spec["iterations"]):
            t = time.perf_counter()
            iteration()
            per_step.append((time.perf_counter() - t) * 1000 / mu)
        q = statistics.quantiles(per_step, n=10) if len(per_step) > 1 else per_step * 9
        return {
            "ms_per_step": statistics.median(per_step),
            "ms_per_step_p10": q[0],
            "ms_per_step_p90": q[-1],
            "first_step_ms": first_ms,
        }

    model = Lecture(spec["weights"], vocab, n, d)
    reordered = LectureReordered(spec["weights"], vocab, n, d)
    # Greedy responses and their rewards at init, for the harness to compare with Rust's.
    with torch.no_grad():
        logits = model(train)
        if not torch.allclose(logits, reordered(train), rtol=1e-4, atol=1e-4):
            raise SystemExit("the reordered model disagrees with the lecture's")
        greedy = logits.argmax(-1)
        greedy_rewards = inclusion_ordering(train, greedy[:, None, :])[:, 0]
    report = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "greedy": greedy.tolist(),
        "greedy_rewards": greedy_rewards.tolist(),
        **timed(model),
        "reordered": timed(reordered),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
