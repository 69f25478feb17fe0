"""llm-d's published Qwen3-32B run as bench.tiered replays it: inference-perf's data set (150
groups x 5 prompts, shuffled once, cycled), their stages run one at a time as its load generator
runs them, and the verdict against both write-ups' figures (bench/data). No runs here."""
from __future__ import annotations

from bench.benchmark import BenchConfig
from bench.tiered import (
    LLMD_INTERVAL_S, llmd_phases, llmd_prompts, llmd_published, llmd_stages, llmd_verdict,
)


def test_the_prompt_set_is_150_groups_of_5_sharing_a_6000_word_context():
    prompts = llmd_prompts(1)
    assert len(prompts) == 750 == len({p[0] for p in prompts})
    groups: dict[str, set] = {}
    for session, system, question in prompts:
        groups.setdefault(session.split("p")[0], set()).add(system)
    assert len(groups) == 150 and all(len(s) == 1 for s in groups.values())
    assert len(prompts[0][1].split()) == 6002 and len(prompts[0][2].split()) == 1202
    # shuffled once (inference-perf random.shuffle), not group by group
    assert [p[0] for p in prompts[:5]] != [f"g0p{k}" for k in range(5)]


def test_stages_run_one_after_another_each_cycling_on_through_the_fixed_prompts():
    stages = llmd_stages(quick=False)
    pub = llmd_published()["workload"]
    assert stages[0] == ("warmup", 15.0, 50.0)
    assert [(q, d) for _, q, d in stages[1:]] == [(float(q), float(d)) for q, d in pub["stages"]]
    phases = llmd_phases(stages[:4], 1)(BenchConfig("", salt="s"))
    assert [p.scenario for p in phases] == ["warmup", "qps-3", "qps-10", "qps-15"]
    prompts = llmd_prompts(1)
    i = 0
    for phase, (_, qps, secs) in zip(phases, stages[:4]):
        times = [j.arrival_s for j in phase.jobs]
        assert times == sorted(times)
        assert LLMD_INTERVAL_S <= times[0] and times[-1] < LLMD_INTERVAL_S + secs
        assert abs(len(times) / (qps * secs) - 1) < 0.25          # Poisson at the rate
        for job in phase.jobs:                                     # the next prompt, cycling
            assert job.session.split("/")[1] == prompts[i % 750][0]
            assert job.system == prompts[i % 750][1]
            i += 1


def _stage(mean, p90, out=None):
    return {"ttft_mean_s": mean, "ttft_p90_s": p90, "output_tok_s": out}


def test_the_verdict_holds_a_run_to_their_figures_and_can_fail():
    pub = llmd_published()
    kvm = pub["kv_cache_manager_73_capacity"]
    mi, pi = kvm["columns"].index("ttft_mean_s"), kvm["columns"].index("ttft_p90_s")
    qs = [q for q, _ in pub["workload"]["stages"]]
    theirs = {q: kvm["per_qps"][str(q)] for q in qs}
    blind = {f"qps-{q}": _stage(theirs[q]["random"][mi] * 1.5, theirs[q]["random"][pi] * 0.6)
             for q in qs} | {"all": _stage(1, 1, 1000.0)}
    aware = {f"qps-{q}": _stage(theirs[q]["precise"][mi] * 0.7, 1) for q in qs} | {
        "all": _stage(1, 1, 2100.0)}
    v = llmd_verdict({"roundrobin": {"stages": blind}, "prefixaware": {"stages": aware}})
    x = v["arms"]["roundrobin"]
    assert v["their_knee"] == 20 and x["knee"] == 20 and x["knee_ok"]
    assert x["blind_ok"] and x["aware_ok"] and x["ratio_ok"]      # 2.1 against 1.97
    blind["qps-60"] = _stage(theirs[60]["random"][mi] * 2.2, 1)   # one stage 2.2x off
    aware["all"] = _stage(1, 1, 3000.0)                           # ratio 3.0: > 25% off
    blind["qps-15"] = _stage(3.0, 3.0)                            # the knee a stage early
    x = llmd_verdict({"roundrobin": {"stages": blind}, "prefixaware": {"stages": aware}}
                     )["arms"]["roundrobin"]
    assert not x["blind_ok"] and not x["ratio_ok"] and x["knee"] == 15 and x["knee_ok"]


def test_the_sensitivity_run_takes_the_output_length_their_figures_imply():
    """Configured to 1,000 output tokens, their 3 QPS stage (no saturation) gives 424-477
    output tokens/s over requests/s under every scheduler; the sensitivity run uses their
    mean. Past saturation the ratio falls, so it is not a length there."""
    from bench.tiered import llmd_implied_output_len, llmd_output_ratios

    ratios = llmd_output_ratios()
    assert set(ratios) == {"random", "precise", "estimated", "load"}
    first = [v[0] for v in ratios.values()]
    assert all(400 < x < 500 for x in first)
    n = llmd_implied_output_len()
    assert n % 10 == 0 and min(first) <= n <= max(first) and n < llmd_published()[
        "workload"]["output_len"]
    assert all(v[-1] < v[0] / 2 for v in ratios.values())
