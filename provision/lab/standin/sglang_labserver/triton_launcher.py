"""What Triton does in the container at the first kernel launch: it builds its C launcher.

Triton 3.6 (the release torch 2.11 pins for SGLang 0.5.23), `triton/runtime/build.py` and the CUDA backend's
`driver.py` (`compile_module_from_src`), with the messages Triton 3.6.0 printed on a real H100:
- the compiler is `$CC`, else `gcc`, else `clang` on PATH (`get_cc`); with none, `RuntimeError("Failed to find C
  compiler. Please specify via CC environment variable or set triton.knobs.build.impl.")`;
- the headers are the running Python's (`sysconfig.get_paths(scheme)["include"]`, `posix_local` read as
  `posix_prefix`): a venv's interpreter points at the system's `/usr/include/python3.X`, which only the distribution's
  `python3-dev` provides;
- `cc cuda_utils.c -O3 -shared -fPIC -Wno-psabi -o <so> -I<include>` runs through `subprocess.check_call`, so a
  missing header is the compiler's own "cuda_utils.c:7:10: fatal error: Python.h: No such file or directory" and a
  `CalledProcessError`;
- the module is kept in Triton's cache (`$TRITON_CACHE_DIR`, else `~/.triton/cache`) under the sha256 of its
  source, and loaded from there; a later start finds it and builds nothing.

The launcher here is a tiny extension of the same shape (it includes `Python.h` and defines `PyInit_<name>`); the
real one also links `-lcuda`, which the lab's containers have no library for.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sysconfig
import tempfile
import uuid
from pathlib import Path

NAME = "cuda_utils"
# Python.h on line 7, column 10, where Triton's cuda_utils.c has it (the compiler's message names the place)
SOURCE = """/* provision lab: a launcher of the shape of Triton's cuda_utils.c */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *launch(PyObject *self, PyObject *args) { Py_RETURN_NONE; }

static PyMethodDef methods[] = {{"launch", launch, METH_VARARGS, "launch a kernel"}, {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "cuda_utils", NULL, -1, methods};

PyMODINIT_FUNC PyInit_cuda_utils(void) { return PyModule_Create(&module); }
"""


def get_cc() -> str:
    cc = os.environ.get("CC")
    if cc is None:
        cc = shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise RuntimeError(
            "Failed to find C compiler. Please specify via CC environment variable or set triton.knobs.build.impl."
        )
    return cc


def python_include() -> str:
    scheme = sysconfig.get_default_scheme()
    if scheme == "posix_local":
        scheme = "posix_prefix"
    return sysconfig.get_paths(scheme=scheme)["include"]


def cache_dir() -> Path:
    return Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")


def build(src_path: str, out_dir: str) -> str:
    so = os.path.join(out_dir, NAME + sysconfig.get_config_var("EXT_SUFFIX"))
    cmd = [get_cc(), src_path, "-O3", "-shared", "-fPIC", "-Wno-psabi", "-o", so, f"-I{python_include()}"]
    subprocess.check_call(cmd)
    return so


def load():
    """The launcher module: from the cache, else built now and put there."""
    key = hashlib.sha256(SOURCE.encode()).hexdigest()
    cached = cache_dir() / key / (NAME + sysconfig.get_config_var("EXT_SUFFIX"))
    if not cached.is_file():
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "cuda_utils.c")
            Path(src).write_text(SOURCE)
            so = build(src, tmp)
            cached.parent.mkdir(parents=True, exist_ok=True)
            # a name of this writer's own, as Triton's FileCacheManager.put makes one: two first generates at once
            # each build, and each puts its copy in place whole
            part = cached.with_name(f"{cached.name}.tmp.pid_{os.getpid()}_{uuid.uuid4()}")
            shutil.copyfile(so, part)
            part.replace(cached)
    spec = importlib.util.spec_from_file_location(NAME, cached)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
