"""Loading pairs: presets, custom ids, clear errors for every failure, and a shared, thread-safe cache.

Everything here is offline. The model hub is replaced by ``FakeHub``, which answers
``HfApi.model_info`` and ``HfApi.get_safetensors_metadata`` the way the hub does, raising
huggingface_hub's own exception types with real HTTP responses, and serves "hub" models from tiny
local folders through ``from_pretrained``. Every failure is followed by a successful load of the
embedded pair and a short generation: the failure leaves the process serving.
"""

from __future__ import annotations

import sys
import threading
import time

import huggingface_hub
import pytest
import torch
from huggingface_hub import HfApi
from huggingface_hub.errors import (
    GatedRepoError,
    LocalEntryNotFoundError,
    NotASafetensorsRepoError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    Response,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import ModelInfo
from huggingface_hub.utils import SafetensorsFileMetadata, SafetensorsRepoMetadata, TensorInfo
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from specviz import Sampling, autoregressive_generate, speculative_generate
from specviz import pair as pairs
from specviz.pair import CROSS, EMBEDDED, ENGLISH, OOM_ERRORS, PRESETS, PairError, encode_prompt, load_pair, resolve
from specviz.pair import download
from tests.conftest import tiny_lm

_http = sys.modules[Response.__module__]  # huggingface_hub's HTTP client module (httpx or its fork)

SMOL = "SmolLM2-135M-Instruct -> SmolLM2-360M-Instruct"
LLAMA = "Llama-3.2-1B-Instruct -> Llama-3.2-3B-Instruct"


def save_tiny(folder, words: list[str], vocab: int, seed: int, layers: int = 1, chat_template: str | None = None):
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[1]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=words[0], unk_token=words[1])
    if chat_template:
        fast.chat_template = chat_template
    tiny_lm(vocab=vocab, layers=layers, seed=seed, init=0.3).save_pretrained(folder)
    fast.save_pretrained(folder)
    return str(folder)


WORDS = ["<eos>", "<unk>"] + [f"w{i}" for i in range(30)]
OTHER_WORDS = WORDS[:2] + [f"v{i}" for i in range(30)]
CHAT = "{% for m in messages %}w3 {{ m['content'] }} w4 {% endfor %}{% if add_generation_prompt %}w5{% endif %}"


@pytest.fixture(autouse=True)
def clean_state(monkeypatch, tmp_path):
    """No resident pairs, no operator settings, no token and an empty hub cache, before and after each test."""
    for name in (
        pairs.ALLOW_CUSTOM_ENV,
        pairs.MAX_MODEL_GB_ENV,
        pairs.RESIDENT_PAIRS_ENV,
        pairs.PRELOAD_ENV,
        "HF_TOKEN",
        "SPACES_ZERO_GPU",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    pairs.unload_all()
    yield
    pairs.unload_all()


def still_serves():
    """The embedded pair loads and generates: whatever failed before did not break the process."""
    pair = load_pair(EMBEDDED, device="cpu")
    ids = encode_prompt(pair, "def add(a, b):")
    trace = speculative_generate(
        ids,
        pair.drafter,
        pair.target,
        gamma=3,
        sampling=Sampling(0.0),
        max_new_tokens=8,
        eos_token_id=pair.eos_token_ids,
        tokenizer=pair.tokenizer,
    )
    assert 1 <= len(trace.output_ids) <= 8 and trace.output_text


def http_response(status: int, url: str):
    return _http.Response(status, request=_http.Request("GET", url))


class FakeHub:
    """The hub's answers for a few repos, and ``from_pretrained`` serving them from local folders.

    ``repos``: id -> dict(folder, params, sha, gated, safetensors, revisions, cached).
    ``down``: the hub cannot be reached (connection errors, like a DNS failure).
    Every call is recorded in ``calls`` as (what, repo id, kwargs).
    """

    def __init__(self, monkeypatch):
        self.repos: dict[str, dict] = {}
        self.down: BaseException | None = None
        self.calls: list[tuple[str, str, dict]] = []
        self.model_delay = 0.0
        self.fail_model: dict[str, BaseException] = {}
        self.loading_now = 0
        self.most_loading = 0
        self._lock = threading.Lock()
        self._real_tok = AutoTokenizer.from_pretrained
        self._real_model = AutoModelForCausalLM.from_pretrained
        # Plain functions on the class, so that HfApi().model_info(...) passes the HfApi instance first.
        monkeypatch.setattr(HfApi, "model_info", lambda api, *a, **k: self.model_info(api, *a, **k))
        monkeypatch.setattr(
            HfApi, "get_safetensors_metadata", lambda api, *a, **k: self.get_safetensors_metadata(api, *a, **k)
        )
        monkeypatch.setattr(AutoTokenizer, "from_pretrained", self.tokenizer_from_pretrained)
        monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", self.model_from_pretrained)
        # Downloads (specviz.pair.download): a fetch puts the repo in the "cache"; the waiting caller is answered when
        # it is done.
        monkeypatch.setattr(
            download, "HUB", download.Downloads(fetch=self.fetch, sizes=lambda repo_id, revision: 0, wait_s=60)
        )

    def fetch(self, repo_id, revision, stop):
        self.calls.append(("download", repo_id, dict(revision=revision)))
        repo = self._repo(repo_id, revision)
        repo["cached"] = True
        return repo["folder"]

    def add(self, repo_id, folder, params=1000, gated=False, safetensors=True, revisions=("main",), cached=False):
        self.repos[repo_id] = dict(
            folder=folder,
            params=params,
            sha=f"{abs(hash(repo_id)):040x}"[:40],
            gated=gated,
            safetensors=safetensors,
            revisions=set(revisions),
            cached=cached,
        )

    def _repo(self, repo_id, revision):
        url = f"https://huggingface.co/api/models/{repo_id}"
        if self.down is not None:
            raise self.down
        if repo_id not in self.repos:
            raise RepositoryNotFoundError(
                f"404 Client Error. Repository Not Found for url: {url}.", response=http_response(404, url)
            )
        repo = self.repos[repo_id]
        if revision not in (None, repo["sha"], *repo["revisions"]):
            raise RevisionNotFoundError(
                f"404 Client Error. Revision Not Found for url: {url}/revision/{revision}.",
                response=http_response(404, f"{url}/revision/{revision}"),
            )
        return repo

    # HfApi methods (self is the fake; the HfApi instance comes first)
    def model_info(self, api, repo_id, *, revision=None, timeout=None, **kwargs):
        self.calls.append(("model_info", repo_id, dict(revision=revision, timeout=timeout)))
        repo = self._repo(repo_id, revision)
        return ModelInfo(id=repo_id, sha=repo["sha"])

    def get_safetensors_metadata(self, api, repo_id, *, revision=None, timeout=None, **kwargs):
        self.calls.append(("metadata", repo_id, dict(revision=revision, timeout=timeout)))
        repo = self._repo(repo_id, revision)
        if repo["gated"] and not huggingface_hub.get_token():
            url = f"https://huggingface.co/{repo_id}/resolve/{revision}/model.safetensors"
            raise GatedRepoError(
                f"401 Client Error. Cannot access gated repo for url {url}.", response=http_response(401, url)
            )
        if not repo["safetensors"]:
            raise NotASafetensorsRepoError(
                f"'{repo_id}' is not a safetensors repo. Couldn't find 'model.safetensors.index.json' or "
                "'model.safetensors' files."
            )
        tensor = TensorInfo(dtype="BF16", shape=[repo["params"]], data_offsets=(0, 2 * repo["params"]))
        return SafetensorsRepoMetadata(
            metadata=None,
            sharded=False,
            weight_map={"w": "model.safetensors"},
            files_metadata={"model.safetensors": SafetensorsFileMetadata(metadata={}, tensors={"w": tensor})},
        )

    # from_pretrained: hub ids served from folders; a real offline cache miss otherwise
    def _folder(self, kind, repo_id, kwargs):
        self.calls.append((kind, repo_id, dict(kwargs)))
        if repo_id in self.repos and (not kwargs.get("local_files_only") or self.repos[repo_id]["cached"]):
            return self.repos[repo_id]["folder"]
        if repo_id.startswith("/"):
            return repo_id
        assert kwargs.get("local_files_only"), f"the test would reach the network for {repo_id}"
        return None  # let transformers look in the (empty) cache and fail as it does offline

    def tokenizer_from_pretrained(self, repo_id, **kwargs):
        folder = self._folder("tokenizer", repo_id, kwargs)
        if folder is None:
            return self._real_tok(repo_id, **kwargs)
        return self._real_tok(folder, trust_remote_code=kwargs.get("trust_remote_code"))

    def model_from_pretrained(self, repo_id, **kwargs):
        folder = self._folder("model", repo_id, kwargs)
        with self._lock:
            self.loading_now += 1
            self.most_loading = max(self.most_loading, self.loading_now)
        try:
            time.sleep(self.model_delay)
            if repo_id in self.fail_model:
                raise self.fail_model[repo_id]
            if folder is None:
                return self._real_model(repo_id, **kwargs)
            return self._real_model(
                folder,
                dtype=kwargs.get("dtype"),
                trust_remote_code=kwargs.get("trust_remote_code"),
                use_safetensors=kwargs.get("use_safetensors"),
            )
        finally:
            with self._lock:
                self.loading_now -= 1

    def loads(self, kind=("tokenizer", "model")):
        return [c for c in self.calls if c[0] in kind]


@pytest.fixture
def hub(monkeypatch, tmp_path):
    fake = FakeHub(monkeypatch)
    d = save_tiny(tmp_path / "drafter", WORDS, 32, seed=1, chat_template=CHAT)
    t = save_tiny(tmp_path / "target", WORDS, 40, seed=2, layers=2, chat_template=CHAT)  # padded embedding table
    o = save_tiny(tmp_path / "other", OTHER_WORDS, 32, seed=3)
    p = PRESETS[SMOL]
    fake.add(p.drafter, d, params=p.drafter_params)
    fake.add(p.target, t, params=p.target_params)
    fake.add("tests/drafter", d)
    fake.add("tests/target", t, revisions=("main", "v1"))
    fake.add("tests/other", o)
    fake.add("tests/pickle-only", t, safetensors=False)
    fake.add("tests/huge", t, params=9_000_000_000)
    fake.add("tests/gated", t, gated=True)
    return fake


# ---------------------------------------------------------------------------------------------
# The catalogue


def test_presets_are_described_and_resolve_to_ids():
    assert EMBEDDED in PRESETS and PRESETS[EMBEDDED].bundled
    for name, p in PRESETS.items():
        assert p.licence and p.drafter_params < p.target_params, name
        assert p.summary.startswith(p.licence)
        label, drafter, target = resolve(name)
        assert (label, drafter, target) == (name, p.drafter, p.target)
    hub_pairs = [p for n, p in PRESETS.items() if n not in (EMBEDDED, ENGLISH, CROSS)]
    assert len(hub_pairs) == 9 and PRESETS[ENGLISH].instruct and PRESETS[ENGLISH].gguf is not None
    assert [p.gated for p in hub_pairs].count(True) == 2 and PRESETS[LLAMA].gated
    assert all(p.instruct == ("Instruct" in p.target) for p in hub_pairs)
    # The offline cross-tokenizer pair: the embedded drafter (code, its own tokenizer) for the English target, on code
    # prompts.
    cross = PRESETS[CROSS]
    assert cross.own_tokenizer and cross.drafter == PRESETS[EMBEDDED].drafter and cross.gguf == PRESETS[ENGLISH].gguf
    assert not cross.instruct and "own tokenizer" in cross.summary
    assert sorted(n for n, p in PRESETS.items() if p.own_tokenizer) == sorted(
        [CROSS, "Qwen2.5-0.5B-Instruct -> SmolLM2-1.7B-Instruct", "gpt2 -> Llama-3.2-3B-Instruct"]
    )


def test_unknown_preset_and_half_a_pair():
    with pytest.raises(PairError, match="unknown pair"):
        resolve("no such pair")
    with pytest.raises(PairError, match="both a drafter and a target"):
        resolve(drafter="x")


# ---------------------------------------------------------------------------------------------
# Local folders (the command line's custom pairs)


def test_local_folders_load_and_generate(tmp_path):
    d = save_tiny(tmp_path / "d", WORDS, 32, seed=1)
    t = save_tiny(tmp_path / "t", WORDS, 40, seed=2, layers=2)  # padded embedding table
    pair = load_pair(drafter=d, target=t, device="cpu", allow_custom=True)
    assert pair.vocab_size == 32
    # Frozen for inference: no forward pass builds a graph, whichever thread or grad mode runs it.
    assert not any(p.requires_grad for m in (pair.drafter, pair.target) for p in m.parameters())
    with torch.enable_grad():
        assert not pair.target(torch.tensor([[1, 2]])).logits.requires_grad
    ids = pair.tokenizer("w1 w2 w3", add_special_tokens=False)["input_ids"]
    trace = speculative_generate(
        ids, pair.drafter, pair.target, gamma=3, sampling=Sampling(1.0), max_new_tokens=20, tokenizer=pair.tokenizer
    )
    assert all(t < 32 for t in trace.output_ids)
    assert trace.output_text == pair.tokenizer.decode(trace.output_ids)


def test_pairs_naming_the_same_model_share_it_and_its_tokenizer(tmp_path, monkeypatch):
    """A second pair loads only what the first does not hold (the cross pair's target is the English pair's): the
    same target object and tokenizer, its weights read once; once no pair holds it, it is read again."""
    import gc

    from transformers import AutoModelForCausalLM

    read = []
    real = AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(
        AutoModelForCausalLM, "from_pretrained", lambda ref, *a, **k: read.append(ref) or real(ref, *a, **k)
    )
    d1 = save_tiny(tmp_path / "d1", WORDS, 32, seed=1)
    d2 = save_tiny(tmp_path / "d2", WORDS, 32, seed=3)
    t = save_tiny(tmp_path / "t", WORDS, 40, seed=2, layers=2)
    first = load_pair(drafter=d1, target=t, device="cpu", allow_custom=True)
    second = load_pair(drafter=d2, target=t, device="cpu", allow_custom=True)
    assert second.target is first.target and second.tokenizer is first.tokenizer
    assert read == [d1, t, d2]
    ids = second.tokenizer("w1 w2 w3", add_special_tokens=False)["input_ids"]
    trace = speculative_generate(ids, second.drafter, second.target, gamma=3, sampling=Sampling(0.0),
                                 max_new_tokens=6, tokenizer=second.tokenizer)
    assert 1 <= len(trace.output_ids) <= 6
    del first, second, trace
    pairs.unload_all()
    gc.collect()
    load_pair(drafter=d1, target=t, device="cpu", allow_custom=True)
    assert read == [d1, t, d2, d1, t]


@pytest.mark.skipif(not pairs.english_available(), reason="the English pair's target package is not installed")
def test_a_tested_presets_drafter_has_its_packaged_targets_vocabulary_token_for_token(monkeypatch):
    """What lets a load of such a preset (``Preset.tokenizer_tested``) read the target's tokenizer alone and skip the
    comparison: the drafter's shipped tokenizer and the packaged target's map every token to the same id."""
    from specviz.pair import loading

    tested = [name for name, p in PRESETS.items() if p.tokenizer_tested]
    assert tested == [ENGLISH] and all(PRESETS[n].gguf is not None for n in tested)
    for name in tested:
        preset = PRESETS[name]
        target, _ = loading._packaged_target(preset, loading.ModelRef(preset.target, None), lambda *a: None)
        drafter = AutoTokenizer.from_pretrained(preset.drafter)
        target_tok = AutoTokenizer.from_pretrained(target.id)
        loading.check_same_tokenizer(preset.drafter, drafter, target.id, target_tok)  # raises on any difference
        assert drafter.get_vocab() == target_tok.get_vocab() and len(drafter) == len(target_tok)
        # the load skips reading the drafter's tokenizer, and the pair's tokenizer is the target's
        loaded, real = [], loading._load_tokenizer
        monkeypatch.setattr(loading, "_load_tokenizer", lambda ref, *a: loaded.append(ref.id) or real(ref, *a))
        pair = load_pair(name, device="cpu")
        assert loaded == [target.id] and pair.drafter_tokenizer is None
        assert pair.tokenizer.get_vocab() == drafter.get_vocab()


def test_different_tokenizers_are_refused_naming_both(tmp_path):
    d = save_tiny(tmp_path / "d", WORDS, 32, seed=1)
    t = save_tiny(tmp_path / "t", OTHER_WORDS, 32, seed=2)
    with pytest.raises(PairError, match=r"drafter '.*d' and the target '.*t' use different tokenizers"):
        load_pair(drafter=d, target=t, device="cpu", allow_custom=True)
    still_serves()


def test_the_web_demo_never_loads_a_server_folder(tmp_path, monkeypatch):
    d = save_tiny(tmp_path / "d", WORDS, 32, seed=1)
    monkeypatch.setenv(pairs.ALLOW_CUSTOM_ENV, "1")
    with pytest.raises(PairError, match="is not a model id"):
        load_pair(drafter=d, target=d, device="cpu")
    still_serves()


# ---------------------------------------------------------------------------------------------
# Every failure: a clear message, then the app still serves


def test_custom_ids_are_off_unless_the_operator_allows_them(hub):
    with pytest.raises(PairError, match="custom model ids are turned off.*SPECVIZ_ALLOW_CUSTOM_MODELS=1"):
        load_pair(drafter="tests/drafter", target="tests/target", device="cpu")
    assert hub.calls == []  # refused before asking the hub anything
    with pytest.raises(PairError, match="not accepted here"):
        load_pair(drafter="tests/drafter", target="tests/target", device="cpu", allow_custom=False)
    still_serves()


@pytest.mark.parametrize(
    "down",
    [OfflineModeIsEnabled("offline mode is enabled"), _http.ConnectError("[Errno -2] Name or service not known")],
    ids=["offline-mode", "dns-failure"],
)
def test_hub_unreachable(hub, monkeypatch, down):
    hub.down = down
    # A preset falls back to the local cache, which is empty: the message says both.
    with pytest.raises(PairError, match="not in the local cache and the model hub cannot be reached"):
        load_pair(SMOL, device="cpu")
    # A custom id is refused: its size cannot be checked.
    monkeypatch.setenv(pairs.ALLOW_CUSTOM_ENV, "1")
    with pytest.raises(PairError, match="cannot be reached, so 'tests/drafter' cannot be checked"):
        load_pair(drafter="tests/drafter", target="tests/target", device="cpu")
    still_serves()


def test_hub_unreachable_but_cached_preset_loads(hub):
    hub.down = OfflineModeIsEnabled("offline mode is enabled")
    for repo in hub.repos.values():
        repo["cached"] = True
    pair = load_pair(SMOL, device="cpu")
    assert pair.instruct and pair.preset is PRESETS[SMOL]
    assert all(c[2]["local_files_only"] for c in hub.loads())


def test_repository_not_found(hub, monkeypatch):
    monkeypatch.setenv(pairs.ALLOW_CUSTOM_ENV, "1")
    with pytest.raises(PairError, match="'tests/no-such-model' was not found on the model hub"):
        load_pair(drafter="tests/no-such-model", target="tests/target", device="cpu")
    assert hub.loads() == []
    still_serves()


def test_revision_not_found(hub, monkeypatch):
    monkeypatch.setenv(pairs.ALLOW_CUSTOM_ENV, "1")
    with pytest.raises(PairError, match="'tests/target@nope': the requested revision does not exist"):
        load_pair(drafter="tests/drafter", target="tests/target@nope", device="cpu")
    assert hub.loads() == []
    still_serves()


def test_gated_preset_without_a_token_is_refused_before_the_hub(hub, monkeypatch):
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    with pytest.raises(PairError, match="gated.*set HF_TOKEN"):
        load_pair(LLAMA, device="cpu")
    assert hub.calls == []
    still_serves()


def test_gated_model_without_access(hub, monkeypatch):
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    monkeypatch.setenv(pairs.ALLOW_CUSTOM_ENV, "1")
    with pytest.raises(PairError, match="'tests/gated' is gated: accept its licence.*HF_TOKEN"):
        load_pair(drafter="tests/drafter", target="tests/gated", device="cpu")
    assert hub.loads() == []
    still_serves()


def test_no_safetensors_weights(hub, monkeypatch):
    monkeypatch.setenv(pairs.ALLOW_CUSTOM_ENV, "1")
    with pytest.raises(PairError, match="'tests/pickle-only' has no safetensors weights"):
        load_pair(drafter="tests/drafter", target="tests/pickle-only", device="cpu")
    assert hub.loads() == []
    still_serves()


def test_over_the_size_limit_is_refused_before_any_download(hub, monkeypatch):
    monkeypatch.setenv(pairs.ALLOW_CUSTOM_ENV, "1")
    monkeypatch.setenv("SPECVIZ_CPU_DTYPE", "fp32")  # the sizes below are fp32's, whatever this CPU's own form
    with pytest.raises(
        PairError,
        match=r"9B parameters together: 36\.0 GB in float32 on cpu, over this server's limit of 16 GB "
              r"\(SPECVIZ_MAX_MODEL_GB\)",
    ):
        load_pair(drafter="tests/drafter", target="tests/huge", device="cpu")
    assert hub.loads() == []  # not even the tokenizers
    monkeypatch.setenv(pairs.MAX_MODEL_GB_ENV, "0.000001")  # 1 kB: the tiny pair's 2,000 parameters are 8 kB
    with pytest.raises(PairError, match="over this server's limit of 1e-06 GB"):
        load_pair(drafter="tests/drafter", target="tests/target", device="cpu")
    assert hub.loads() == []
    still_serves()


def test_more_than_the_free_memory_is_refused_before_loading_weights(hub, monkeypatch):
    monkeypatch.setenv("SPECVIZ_CPU_DTYPE", "fp32")  # the size below is fp32's, whatever this CPU's own form
    hub.repos[PRESETS[SMOL].target]["params"] = 10**13  # 40 TB in fp32
    with pytest.raises(PairError, match="needs about 40000.*GB of memory on cpu.*pick a smaller pair"):
        load_pair(SMOL, device="cpu")
    assert hub.loads("model") == []
    still_serves()


def test_free_memory_is_the_containers_when_it_has_a_limit(tmp_path):
    from specviz.pair.memory import cgroup_free_bytes as _cgroup_free_bytes

    assert _cgroup_free_bytes(str(tmp_path)) is None  # no cgroup files: no limit known
    (tmp_path / "memory.max").write_text("max\n")
    (tmp_path / "memory.current").write_text("1000\n")
    assert _cgroup_free_bytes(str(tmp_path)) is None  # cgroup v2 without a limit
    (tmp_path / "memory.max").write_text(f"{16 * 2**30}\n")
    assert _cgroup_free_bytes(str(tmp_path)) == 16 * 2**30 - 1000


def test_tokenizers_differ_before_weights(hub, monkeypatch):
    monkeypatch.setenv(pairs.ALLOW_CUSTOM_ENV, "1")
    with pytest.raises(
        PairError, match="the drafter 'tests/other' and the target 'tests/target' use different tokenizers"
    ):
        load_pair(drafter="tests/other", target="tests/target", device="cpu")
    assert hub.loads("model") == []
    still_serves()


def test_remote_code_is_never_run(hub, monkeypatch):
    monkeypatch.setenv(pairs.ALLOW_CUSTOM_ENV, "1")
    real = hub.tokenizer_from_pretrained

    def needs_code(repo_id, **kwargs):
        if repo_id == "tests/target":
            assert kwargs["trust_remote_code"] is False
            raise ValueError(
                "The repository tests/target contains custom code which must be executed to correctly load "
                "the model. Please pass the argument `trust_remote_code=True` to allow custom code to be run."
            )
        return real(repo_id, **kwargs)

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", needs_code)
    with pytest.raises(PairError, match="needs its own Python code.*never runs code from the hub"):
        load_pair(drafter="tests/drafter", target="tests/target", device="cpu")
    still_serves()


@pytest.mark.parametrize(
    "oom",
    [MemoryError(), torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")],
    ids=["cpu", "cuda"],
)
def test_out_of_memory_while_loading(hub, oom):
    hub.fail_model[PRESETS[SMOL].target] = oom
    with pytest.raises(PairError, match="does not fit in this machine's memory; pick a smaller pair"):
        load_pair(SMOL, device="cpu")
    assert pairs.resident_pairs() == []  # nothing half-loaded stays
    still_serves()
    del hub.fail_model[PRESETS[SMOL].target]
    assert load_pair(SMOL, device="cpu").name == SMOL  # the same pair loads once memory allows


@pytest.mark.parametrize("oom", [MemoryError, torch.OutOfMemoryError], ids=["cpu", "cuda"])
def test_out_of_memory_while_generating_reaches_the_caller_and_the_pair_still_works(oom, monkeypatch):
    """The engine lets the error through unchanged, so the demo's handler can catch OOM_ERRORS and say so."""
    pair = load_pair(EMBEDDED, device="cpu")
    ids = encode_prompt(pair, "def add(a, b):")
    real_forward = pair.target.forward
    calls = []

    def forward(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the first verification after the prefill
            raise oom("CUDA out of memory. Tried to allocate 2.00 GiB" if oom is torch.OutOfMemoryError else "")
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(pair.target, "forward", forward)
    kw = dict(sampling=Sampling(0.0), max_new_tokens=16, eos_token_id=pair.eos_token_ids, tokenizer=pair.tokenizer)
    with pytest.raises(OOM_ERRORS):
        speculative_generate(ids, pair.drafter, pair.target, gamma=4, **kw)
    calls.clear()
    with pytest.raises(OOM_ERRORS):
        autoregressive_generate(ids, pair.target, **kw)
    monkeypatch.setattr(pair.target, "forward", real_forward)
    pairs.free_memory(pair.device)
    assert load_pair(EMBEDDED, device="cpu") is pair  # still resident, not corrupted
    spec = speculative_generate(ids, pair.drafter, pair.target, gamma=4, **kw)
    base = autoregressive_generate(ids, pair.target, **kw)
    assert spec.output_ids == base.output_ids  # greedy: the target's own output
    still_serves()


def test_hub_errors_become_messages():
    from specviz.pair.errors import explain as _explain

    url = "https://huggingface.co/meta-llama/Llama-3.2-1B/resolve/main/config.json"
    gated = GatedRepoError("401 Client Error: access to model is restricted", response=http_response(401, url))
    message = str(_explain("meta-llama/Llama-3.2-1B", gated))
    assert "gated" in message and "HF_TOKEN" in message
    assert "cannot be reached" in str(_explain("x/y", LocalEntryNotFoundError("offline")))
    assert "memory" in str(_explain("x/y", MemoryError()))


# ---------------------------------------------------------------------------------------------
# Successful hub loads: what is asked of the hub and of transformers


def test_custom_pair_with_a_pinned_revision(hub, monkeypatch):
    monkeypatch.setenv(pairs.ALLOW_CUSTOM_ENV, "1")
    steps = []
    pair = load_pair(
        drafter="tests/drafter", target="tests/target@v1", device="cpu", progress=lambda f, m: steps.append((f, m))
    )
    assert pair.name == "tests/drafter -> tests/target@v1" and pair.target_id == "tests/target@v1"
    assert ("model_info", "tests/target", dict(revision="v1", timeout=pairs.HUB_TIMEOUT_S)) in hub.calls
    sha = hub.repos["tests/target"]["sha"]
    assert pair.revisions[1] == sha
    for kind, repo, kwargs in hub.loads():
        assert kwargs["trust_remote_code"] is False  # never run code from the hub
        assert kwargs["revision"] == hub.repos[repo]["sha"]  # every file from the commit that was checked
        if kind == "model":
            assert kwargs["use_safetensors"] is True
    assert pair.instruct  # the tokenizer has a chat template
    # Progress: from 0 to 1, never backwards, a message at every stage.
    fractions = [f for f, _ in steps]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0 and all(0 <= f <= 1 for f in fractions)
    assert len(steps) >= 6 and all(m for _, m in steps)
    # Asked again: the resident pair, at once.
    again = []
    assert (
        load_pair(
            drafter="tests/drafter", target="tests/target@v1", device="cpu", progress=lambda f, m: again.append(f)
        )
        is pair
    )
    assert again == [1.0]


def test_preset_loads_from_the_hub_and_applies_the_chat_template(hub):
    pair = load_pair(SMOL, device="cpu")
    assert pair.instruct and pairs.loaded_pair(SMOL, device="cpu") is pair
    chat = encode_prompt(pair, "w7 w8")
    assert pair.tokenizer.convert_ids_to_tokens(chat) == ["w3", "w7", "w8", "w4", "w5"]
    assert encode_prompt(pair, "w7 w8", chat=False) == pair.tokenizer("w7 w8", add_special_tokens=False)["input_ids"]
    trace = speculative_generate(
        chat,
        pair.drafter,
        pair.target,
        gamma=3,
        sampling=Sampling(0.0),
        max_new_tokens=6,
        eos_token_id=pair.eos_token_ids,
        tokenizer=pair.tokenizer,
    )
    assert len(trace.output_ids) <= 6


def test_no_chat_template_is_a_clear_error(embedded):
    with pytest.raises(PairError, match="has no chat template; turn the chat template off"):
        encode_prompt(embedded, "def f():", chat=True)
    assert encode_prompt(embedded, "def f():") == embedded.tokenizer("def f():", add_special_tokens=False)["input_ids"]


# ---------------------------------------------------------------------------------------------
# One resident pair, shared, safe under concurrent requests


def run_threads(targets: list, timeout: float = 60.0):
    results: list = [None] * len(targets)

    def run(i, fn):
        try:
            results[i] = fn()
        except BaseException as err:  # noqa: BLE001 - reported to the test
            results[i] = err

    threads = [threading.Thread(target=run, args=(i, fn), daemon=True) for i, fn in enumerate(targets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "deadlock: a loading thread did not finish"
    return results


def test_two_visitors_asking_for_different_pairs_at_once(hub, monkeypatch):
    monkeypatch.setenv(pairs.ALLOW_CUSTOM_ENV, "1")
    hub.model_delay = 0.2  # the loads overlap in time
    a = lambda: load_pair(drafter="tests/drafter", target="tests/target", device="cpu")  # noqa: E731
    b = lambda: load_pair(SMOL, device="cpu")  # noqa: E731
    pa, pb = run_threads([a, b])
    assert not isinstance(pa, BaseException) and not isinstance(pb, BaseException), (pa, pb)
    assert hub.most_loading == 1  # one load at a time: never two pairs' weights arriving at once
    assert len(pairs.resident_pairs()) == 1  # the limit holds
    for pair in (pa, pb):  # both visitors got a whole, working pair
        ids = encode_prompt(pair, "w1 w2")
        trace = speculative_generate(
            ids, pair.drafter, pair.target, gamma=2, sampling=Sampling(1.0), max_new_tokens=5, tokenizer=pair.tokenizer
        )
        assert 1 <= len(trace.output_ids) <= 5
    still_serves()


def test_many_visitors_asking_for_the_same_pair_share_one_load(hub):
    hub.model_delay = 0.2
    got = run_threads([lambda: load_pair(SMOL, device="cpu")] * 6)
    assert all(p is got[0] for p in got) and isinstance(got[0], pairs.Pair)
    assert len(hub.loads("model")) == 2  # the drafter and the target, once


def test_a_failed_load_fails_every_waiting_visitor_and_is_not_cached(hub):
    hub.model_delay = 0.2
    hub.fail_model[PRESETS[SMOL].target] = MemoryError()
    got = run_threads([lambda: load_pair(SMOL, device="cpu")] * 3)
    assert all(isinstance(e, PairError) and "memory" in str(e) for e in got), got
    del hub.fail_model[PRESETS[SMOL].target]
    assert load_pair(SMOL, device="cpu").name == SMOL


def test_resident_pairs_are_configurable_and_least_recently_used_goes_first(hub, monkeypatch):
    monkeypatch.setenv(pairs.ALLOW_CUSTOM_ENV, "1")
    monkeypatch.setenv(pairs.RESIDENT_PAIRS_ENV, "2")
    smol = load_pair(SMOL, device="cpu")
    embedded = load_pair(EMBEDDED, device="cpu")
    assert pairs.resident_pairs() == [SMOL, EMBEDDED]
    assert load_pair(SMOL, device="cpu") is smol  # used again: now the most recent
    load_pair(drafter="tests/drafter", target="tests/target", device="cpu")
    assert pairs.resident_pairs() == [SMOL, "tests/drafter -> tests/target"]
    assert pairs.loaded_pair(EMBEDDED, device="cpu") is None
    assert embedded.target is not None  # a visitor still holding it is unaffected
    monkeypatch.setenv(pairs.RESIDENT_PAIRS_ENV, "zero")
    with pytest.raises(PairError, match="SPECVIZ_RESIDENT_PAIRS='zero' is not a number"):
        load_pair(EMBEDDED, device="cpu")


def test_the_resident_set_is_bounded_by_memory_too_and_each_pair_let_go_is_logged(hub, monkeypatch, caplog):
    """Within the count limit, a pair that does not fit in the free memory lets the least recently used pairs go, as
    many as its weights need and no more, each named in the log with the reason; one that would not fit even with
    every pair gone is refused and nothing is let go."""
    from specviz.pair import loading

    monkeypatch.setenv(pairs.ALLOW_CUSTOM_ENV, "1")
    monkeypatch.setenv(pairs.RESIDENT_PAIRS_ENV, "3")
    load_pair(SMOL, device="cpu")
    load_pair(EMBEDDED, device="cpu")
    assert pairs.resident_pairs() == [SMOL, EMBEDDED]
    # the free memory as the machine would report it: short while two pairs are loaded
    free = {2: 0, 1: 10**12, 0: 10**12}
    fake = lambda dev: free[len(pairs.resident_pairs())]  # noqa: E731 - a stand-in read where it is looked up
    monkeypatch.setattr(loading, "available_memory_bytes", fake)
    monkeypatch.setattr(pairs.cache, "available_memory_bytes", fake)
    with caplog.at_level("WARNING", logger="specviz"):
        load_pair(drafter="tests/drafter", target="tests/target", device="cpu")
    assert pairs.resident_pairs() == [EMBEDDED, "tests/drafter -> tests/target"]  # one let go: the least recent
    let_go = [r.getMessage() for r in caplog.records if "unloaded the pair" in r.getMessage()]
    assert len(let_go) == 1 and SMOL in let_go[0] and "GB needed on cpu, 0.00 GB free" in let_go[0], let_go
    # would not fit even with every pair gone: refused, and both stay
    monkeypatch.setattr(pairs.cache, "_reclaimable_bytes", lambda dev: 0)
    free[2] = 0
    with pytest.raises(PairError, match="needs about"):
        load_pair(SMOL, device="cpu")
    assert pairs.resident_pairs() == [EMBEDDED, "tests/drafter -> tests/target"]


def test_preload_at_start_up(hub, monkeypatch):
    assert list(pairs.preload()) == [pairs.default_pair()]  # the default: the English pair where it loads offline
    monkeypatch.setenv(pairs.PRELOAD_ENV, f"{EMBEDDED}, {SMOL}")
    with pytest.raises(PairError, match="2 pairs to preload but SPECVIZ_RESIDENT_PAIRS=1 keeps fewer"):
        pairs.preload()
    monkeypatch.setenv(pairs.RESIDENT_PAIRS_ENV, "3")
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    monkeypatch.setenv(pairs.PRELOAD_ENV, f"{EMBEDDED},{SMOL},{LLAMA}")
    loaded = pairs.preload(device="cpu")
    assert isinstance(loaded[EMBEDDED], pairs.Pair) and isinstance(loaded[SMOL], pairs.Pair)
    assert isinstance(loaded[LLAMA], PairError) and "HF_TOKEN" in str(loaded[LLAMA])  # reported; the rest still load
    assert pairs.resident_pairs()[-2:] == [EMBEDDED, SMOL]  # after the default pair, where it was loaded first
    monkeypatch.setenv(pairs.PRELOAD_ENV, "no such pair")
    with pytest.raises(PairError, match="SPECVIZ_PRELOAD names unknown pairs"):
        pairs.preload()


def test_settle_leaves_the_objects_alive_now_out_of_later_collections_and_thaw_puts_them_back():
    import gc

    from specviz.pair import freeze_long_lived
    from specviz.pair.memory import thaw

    freeze_long_lived()
    frozen = gc.get_freeze_count()
    assert frozen > 0 and gc.collect() >= 0
    thaw()
    assert gc.get_freeze_count() == 0


def test_after_a_load_only_the_young_generations_are_collected_before_the_freeze(monkeypatch):
    """After a pair's load (beside other visitors' runs) the collection before the freeze is a young one: a full one
    walked the whole unfrozen heap holding the interpreter lock (0.25 s after the English pair's load)."""
    from specviz.pair import memory

    asked = []
    monkeypatch.setattr(memory.gc, "collect", lambda *generation: asked.append(generation) or 0)
    monkeypatch.setattr(memory.gc, "freeze", lambda: asked.append("freeze"))
    memory.freeze_long_lived(full=False)
    memory.freeze_long_lived()
    assert asked == [(1,), "freeze", (), "freeze"]
