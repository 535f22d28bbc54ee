"""Kernel names as the step tables print them (tools/gpu-profile, tools/gpu-timeline)."""


def short(full):
    """"void dsv4::cuda::<unnamed>::gemv_kernel<(WFormat)2, 1>(GemvParams)" → "gemv_kernel<(WFormat)2, 1>"."""
    base = full.removeprefix("void ")
    for anonymous in ("(anonymous namespace)::", "<unnamed>::", "unnamed>::"):
        base = base.replace(anonymous, "")
    depth, cut = 0, len(base)
    for i, ch in enumerate(base):  # the parameter list: the first "(" outside template brackets
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0:
            cut = i
            break
    base = base[:cut]
    return base[base.rfind("::", 0, base.find("<") if "<" in base else len(base)) + 2:] if "::" in base else base


def last_step(kernels, first_kernel="embed_kernel"):
    """The kernels of the last decode step: from the last launch of first_kernel (the embedding lookup) on."""
    return steps(kernels, first_kernel)[-1]


# A step's kernels run back to back (at most a few µs apart); a longer idle GPU is the host between steps.
STEP_GAP_NS = 200_000


def steps(kernels, first_kernel="embed_kernel"):
    """The trace cut at every launch of first_kernel (the embedding lookup starts every forward step). Kernels
    with times, (name, start_ns, end_ns, ...), also end each step before its first gap of more than STEP_GAP_NS:
    what runs after it and before the next embedding is the host's work between steps (e.g. a new sequence's
    cache resets after a prefill), not the step's."""
    starts = [i for i, k in enumerate(kernels) if short(k[0]).startswith(first_kernel)]
    if not starts:
        raise SystemExit(f"no {first_kernel} in the trace: not a dsv4 run?")
    timed = len(kernels[0]) >= 3
    cut = []
    for a, b in zip(starts, starts[1:] + [len(kernels)]):
        if not timed:
            cut.append(kernels[a:b])
            continue
        end, last = a + 1, kernels[a][2]
        while end < b and kernels[end][1] - last <= STEP_GAP_NS:
            last = max(last, kernels[end][2])
            end += 1
        cut.append(kernels[a:end])
    return cut


def prefill_step(kernels):
    """The last step lasting at least half the longest: a prefill among decode steps. The first step is the
    first call's, which also does one-time work (e.g. the experts' weights re-tiled): it is left out where there
    are others, so that it neither sets the longest nor is taken."""
    all_steps = steps(kernels)
    if len(all_steps) > 1:
        all_steps = all_steps[1:]
    wall = [max(k[2] for k in s) - s[0][1] for s in all_steps]
    return [s for s, w in zip(all_steps, wall) if 2 * w >= max(wall)][-1]
