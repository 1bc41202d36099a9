"""grpo-lab's `transformer-sort` GRPO loop written as vectorized PyTorch: a pre-LN causal
transformer (learned positions, erf GELU, untied head), autoregressive sampling with a KV
cache, the clipped (clip-higher) token-mean loss, Adam. No Python loop over prompts,
responses or heads; one over positions while generating, as any KV-cache decoder has.
Run only by `grpo-lab bench --pytorch` (through `grpo_ref.py`), which hands it the same
initial weights and prompts as the Rust trainer and refuses to compare unless the greedy
answers at init agree.

The work per iteration mirrors the trainer's: a supervised cold start once (the first step
includes it), then per iteration: roll out G responses per prompt (and the greedy answer to
each training prompt in the same pass), rewards and normalized advantages, log pi_old from
the sampling pass, log pi_ref with a teacher-forced pass when the trainer computes it, mu
optimizer steps (forward, backward, grad-norm clipping, Adam), greedy accuracy on the
held-out prompts.
"""

import math
import resource
import statistics
import time

import torch
import torch.nn.functional as F


def rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class Transformer(torch.nn.Module):
    """The same module as `model::transformer` (flat weights in its visiting order)."""

    def __init__(self, flat, shape):
        super().__init__()
        v, c, d, f, self.layers, self.heads = (
            shape["vocab"], shape["context"], shape["d_model"], shape["d_ff"], shape["layers"], shape["heads"],
        )
        w = torch.tensor(flat, dtype=torch.float32)
        at = 0

        def take(*s):
            nonlocal at
            count = math.prod(s)
            p = torch.nn.Parameter(w[at:at + count].clone().view(*s))
            at += count
            return p

        self.tok_emb, self.pos_emb = take(v, d), take(c, d)
        self.blocks = torch.nn.ModuleList()
        for _ in range(self.layers):
            blk = torch.nn.Module()
            blk.ln1_g, blk.ln1_b, blk.wqkv, blk.wo = take(d), take(d), take(d, 3 * d), take(d, d)
            blk.ln2_g, blk.ln2_b, blk.w1, blk.b1, blk.w2, blk.b2 = take(d), take(d), take(d, f), take(f), take(f, d), take(d)
            self.blocks.append(blk)
        self.lnf_g, self.lnf_b, self.head = take(d), take(d), take(d, v)
        if at != w.numel():
            raise SystemExit(f"weights of another shape: {w.numel()} floats, the shape needs {at}")
        self.d = d

    def _mlp(self, blk, x):
        m = F.layer_norm(x, (self.d,), blk.ln2_g, blk.ln2_b, 1e-5)
        return F.gelu(m @ blk.w1 + blk.b1) @ blk.w2 + blk.b2

    def forward(self, tokens):  # [R, S] -> [R, S, V], causal
        r, s = tokens.shape
        h, d = self.heads, self.d
        x = self.tok_emb[tokens] + self.pos_emb[:s]
        for blk in self.blocks:
            a = F.layer_norm(x, (d,), blk.ln1_g, blk.ln1_b, 1e-5)
            q, k, v = (a @ blk.wqkv).view(r, s, 3, h, d // h).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + y.transpose(1, 2).reshape(r, s, d) @ blk.wo
            x = x + self._mlp(blk, x)
        return F.layer_norm(x, (d,), self.lnf_g, self.lnf_b, 1e-5) @ self.head

    @torch.no_grad()
    def prefill(self, prompts, max_len):
        """The prompts' positions once per prompt: (logits at the last one [B, V], a KV cache
        per layer [B, H, n + max_len, dh] with the prompt's keys and values)."""
        b, n = prompts.shape
        h, d = self.heads, self.d
        x = self.tok_emb[prompts] + self.pos_emb[:n]
        cache = []
        for blk in self.blocks:
            a = F.layer_norm(x, (d,), blk.ln1_g, blk.ln1_b, 1e-5)
            q, k, v = (a @ blk.wqkv).view(b, n, 3, h, d // h).permute(2, 0, 3, 1, 4)
            kc = torch.empty(b, h, n + max_len, d // h)
            vc = torch.empty(b, h, n + max_len, d // h)
            kc[:, :, :n], vc[:, :, :n] = k, v
            cache.append((kc, vc))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + y.transpose(1, 2).reshape(b, n, d) @ blk.wo
            x = x + self._mlp(blk, x)
        logits = F.layer_norm(x[:, -1], (d,), self.lnf_g, self.lnf_b, 1e-5) @ self.head
        return logits, cache

    @torch.no_grad()
    def decode(self, tokens, pos, cache):
        """One new position of every row against the cache: tokens [R] -> logits [R, V]."""
        r = tokens.shape[0]
        h, d = self.heads, self.d
        x = self.tok_emb[tokens] + self.pos_emb[pos]
        for blk, (kc, vc) in zip(self.blocks, cache):
            a = F.layer_norm(x, (d,), blk.ln1_g, blk.ln1_b, 1e-5)
            q, k, v = (a @ blk.wqkv).view(r, 3, h, 1, d // h).unbind(1)
            kc[:, :, pos : pos + 1], vc[:, :, pos : pos + 1] = k, v
            att = torch.softmax((q @ kc[:, :, : pos + 1].transpose(2, 3)) / math.sqrt(d // h), -1)
            x = x + (att @ vc[:, :, : pos + 1]).reshape(r, d) @ blk.wo
            x = x + self._mlp(blk, x)
        return F.layer_norm(x, (d,), self.lnf_g, self.lnf_b, 1e-5) @ self.head


@torch.no_grad()
def generate(model, prompts, g, extra_greedy, max_len, eos, temperature, kv_cache=True):
    """G sampled responses per prompt (rows grouped by prompt), then `extra_greedy` prompts'
    greedy answers as extra rows (the first `extra_greedy` prompts). Closed rows keep reading
    <eos>. Returns tokens [R, T], lengths [R], closed [R], log pi of the sampled tokens [B*G, T]."""
    b, n = prompts.shape
    sampled = b * g
    prompt_rows = torch.cat([prompts.repeat_interleave(g, 0), prompts[:extra_greedy]])
    r = prompt_rows.shape[0]
    if kv_cache:
        first, pcache = model.prefill(prompts, max_len)
        owner = torch.cat([torch.arange(b).repeat_interleave(g), torch.arange(extra_greedy)])
        cache = [(kc[owner], vc[owner]) for kc, vc in pcache]
        logits = first[owner]
    else:
        logits = model(prompt_rows)[:, -1]
    tokens = torch.full((r, max_len), eos, dtype=torch.long)
    logp = torch.zeros(sampled, max_len)
    closed = torch.zeros(r, dtype=torch.bool)
    length = torch.zeros(r, dtype=torch.long)
    steps = 0
    for t in range(max_len):
        if t > 0:
            if bool(closed.all()):
                break
            if kv_cache:
                logits = model.decode(tokens[:, t - 1], n + t - 1, cache)
            else:
                logits = model(torch.cat([prompt_rows, tokens[:, :t]], 1))[:, -1]
        nxt = torch.empty(r, dtype=torch.long)
        nxt[sampled:] = logits[sampled:].argmax(-1)
        if sampled > 0:
            lp = torch.log_softmax(logits[:sampled] / temperature, -1)
            nxt[:sampled] = torch.multinomial(lp.exp(), 1)[:, 0]
        nxt = torch.where(closed, eos, nxt)
        tokens[:, t] = nxt
        if sampled > 0:
            logp[:, t] = lp.gather(1, nxt[:sampled, None])[:, 0]
        length += (~closed).long()
        closed |= nxt == eos
        steps = t + 1
    return tokens[:, :steps], length, closed, logp[:, :steps]


def rewards_of(prompts_rows, tokens, length, closed, n, eos, weights, format_reward):
    """exact · w_exact + distance · w_distance + format (closed with <eos>), per row."""
    truth = prompts_rows.sort(1).values  # [R, n]
    t = tokens.shape[1]
    content_len = torch.where(closed, length - 1, length)
    width = min(n, t)
    pos = torch.arange(width)
    inside = pos[None, :] < content_len[:, None]
    hits = ((tokens[:, :width] == truth[:, :width]) & inside).sum(1)
    exact = closed & (content_len == n) & (hits == n)
    reward = (
        weights.get("exact", 0.0) * exact.float()
        + weights.get("distance", 0.0) * hits.float()
        + format_reward * closed.float()
    )
    return reward, exact


def teacher_forced_logp(model, prompts_rows, tokens, temperature):
    """log pi of every response token [R, T] (the prompt, then the response without its last token)."""
    n = prompts_rows.shape[1]
    logits = model(torch.cat([prompts_rows, tokens[:, :-1]], 1))[:, n - 1 :]
    return torch.log_softmax(logits / temperature, -1).gather(2, tokens[:, :, None])[:, :, 0]


def greedy_answers(model, prompts, max_len, eos):
    """Each prompt's greedy answer, <eos> included when it closed."""
    tokens, length, _, _ = generate(model, prompts, 0, prompts.shape[0], max_len, eos, 1.0)
    return [row[:l].tolist() for row, l in zip(tokens, length)]


def run(spec, threads):
    shape, s = spec["shape"], spec["settings"]
    torch.manual_seed(spec["seed"])
    n, g, b, mu, max_len = s["n"], s["num_generations"], s["prompts_per_iteration"], s["mu"], s["max_len"]
    eos = shape["vocab"] - 1
    temperature = s["temperature"]
    train = torch.tensor(spec["prompts"], dtype=torch.long)
    heldout = torch.tensor(spec["heldout"], dtype=torch.long)
    rss_import = rss_mib()

    model = Transformer(spec["weights"], shape)
    with torch.no_grad():
        greedy = greedy_answers(model, heldout, max_len, eos)

    def timed(kv_cache, iterations):
        torch.manual_seed(spec["seed"])
        policy = Transformer(spec["weights"], shape)
        t0 = time.perf_counter()
        # The supervised cold start: teacher-forced cross-entropy on (prompt, sorted + <eos>).
        sft = s["sft"]
        if sft["steps"] > 0:
            opt = torch.optim.Adam(policy.parameters(), lr=sft["lr"], betas=(s["beta1"], s["beta2"]), eps=s["eps"])
            pool = train[torch.randperm(train.shape[0])[: max(sft["examples"], 1)]]
            for step in range(sft["steps"]):
                idx = torch.arange(step * sft["batch_size"], (step + 1) * sft["batch_size"]) % pool.shape[0]
                p = pool[idx]
                target = torch.cat([p.sort(1).values, torch.full((p.shape[0], 1), eos)], 1)
                logits = policy(torch.cat([p, target[:, :-1]], 1))[:, n - 1 :]
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        cold_ms = (time.perf_counter() - t0) * 1000
        reference = None
        if s["ref_logp"]:
            reference = Transformer(spec["weights"], shape)
            reference.load_state_dict(policy.state_dict())
            reference.requires_grad_(False)
        opt = torch.optim.Adam(policy.parameters(), lr=s["lr"], betas=(s["beta1"], s["beta2"]), eps=s["eps"])
        lo, hi = 1.0 - s["epsilon_low"], 1.0 + s["epsilon_high"]

        def iteration(record):
            laps = {}
            t = time.perf_counter()

            def lap(name):
                nonlocal t
                now = time.perf_counter()
                laps[name] = laps.get(name, 0.0) + (now - t) * 1000
                t = now

            idx = torch.randperm(train.shape[0])[:b] if b < train.shape[0] else torch.arange(train.shape[0])
            prompts = train[idx]
            tokens, length, closed, old_logp = generate(policy, prompts, g, b, max_len, eos, temperature, kv_cache)
            rows = b * g
            prompt_rows = prompts.repeat_interleave(g, 0)
            rewards, exact_rows = rewards_of(
                torch.cat([prompt_rows, prompts]), tokens, length, closed, n, eos, s["reward_weights"], s["format_reward"]
            )
            train_accuracy = exact_rows[rows:].float().mean().item()
            lap("rollout")
            r = rewards[:rows].view(b, g)
            adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-5)).reshape(rows)
            lap("advantages")
            resp = tokens[:rows]
            tt = resp.shape[1]
            mask = (torch.arange(tt)[None, :] < length[:rows, None]).float()
            if reference is not None:
                with torch.no_grad():
                    ref_logp = teacher_forced_logp(reference, prompt_rows, resp, temperature)
            lap("old_ref_logp")
            with torch.no_grad():
                ans = generate(policy, heldout, 0, heldout.shape[0], max_len, eos, 1.0, kv_cache)
                _, exact_h = rewards_of(heldout, ans[0], ans[1], ans[2], n, eos, s["reward_weights"], s["format_reward"])
                heldout_accuracy = exact_h.float().mean().item()
            lap("evaluation")
            for _ in range(mu):
                logp = teacher_forced_logp(policy, prompt_rows, resp, temperature)
                ratio = torch.exp(logp - old_logp)
                a = adv[:, None]
                per_token = -torch.minimum(ratio * a, ratio.clamp(lo, hi) * a)
                loss = (per_token * mask).sum() / mask.sum().clamp(min=1.0)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                lap("forward_backward")
                torch.nn.utils.clip_grad_norm_(policy.parameters(), s["max_grad_norm"])
                opt.step()
                loss.item()
                lap("optimizer")
                if record is not None:
                    record.append(dict(laps))
            return laps, train_accuracy, heldout_accuracy

        # The first step: the cold start, then the first iteration up to its first optimizer step.
        first = []
        iteration(first)
        first_ms = cold_ms + sum(first[0].values())
        for _ in range(spec.get("warmup", 1)):
            iteration(None)
        per_step, cpu_per_step, parts = [], [], []
        heldout_acc = []
        for _ in range(iterations):
            t, cpu = time.perf_counter(), time.process_time()
            laps, _, acc = iteration(None)
            per_step.append((time.perf_counter() - t) * 1000 / mu)
            cpu_per_step.append((time.process_time() - cpu) * 1000 / mu)
            parts.append({k: v / mu for k, v in laps.items()})
            heldout_acc.append(acc)
        q = statistics.quantiles(per_step, n=10) if len(per_step) > 1 else per_step * 9
        names = ["rollout", "advantages", "old_ref_logp", "forward_backward", "optimizer", "evaluation"]
        return {
            "ms_per_step": statistics.median(per_step),
            "ms_per_step_p10": q[0],
            "ms_per_step_p90": q[-1],
            "cpu_ms_per_step": statistics.median(cpu_per_step),
            "first_step_ms": first_ms,
            "cold_start_ms": cold_ms,
            "parts_ms_per_step": {k: statistics.median(p.get(k, 0.0) for p in parts) for k in names},
            "heldout_accuracy": heldout_acc[-1] if heldout_acc else None,
        }

    report = {
        "model": "transformer",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "greedy": greedy,
        **timed(True, spec["iterations"]),
    }
    if spec.get("no_cache_iterations", 0) > 0:
        report["no_cache"] = timed(False, spec["no_cache_iterations"])
    report["peak_rss_mib"] = rss_mib()
    report["rss_after_import_mib"] = rss_import
    return report
