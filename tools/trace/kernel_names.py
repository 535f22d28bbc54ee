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
    starts = [i for i, k in enumerate(kernels) if short(k[0]).startswith(first_kernel)]
    if not starts:
        raise SystemExit(f"no {first_kernel} in the trace: not a dsv4 decode run?")
    return kernels[starts[-1]:]
