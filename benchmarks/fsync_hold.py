"""A disk that does not finish an fsync until told: a server started with :attr:`FsyncHold.env`
(``LD_PRELOAD`` of a small shared library, built here with the C compiler) blocks in every
``fsync`` / ``fdatasync`` while the hold is on; its writes still reach the page cache at once.

    hold = FsyncHold(folder)                       # builds the library once per process
    server = RedisServer(..., env=hold.env)        # or RedisHA(..., env=hold.env)
    hold.hold()                                    # from now, fsync blocks...
    hold.release()                                 # ...until this

A Redis with ``appendfsync everysec`` then keeps answering, but its background fsync never
completes during the hold, so ``WAITAOF 1 0`` answers ``[0, 0]`` after its timeout: the durable
claim it confirms must not count as confirmed (docs/design.md "Amnesia": durable claim). The hold
is a file: the server polls for it every 10 ms inside the blocked call.
"""
from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
import threading

_SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

/* every fsync and fdatasync waits while the file named by ANARCHON_FSYNC_HOLD exists */
static void wait_while_held(void) {
    const char *hold = getenv("ANARCHON_FSYNC_HOLD");
    while (hold && access(hold, F_OK) == 0)
        usleep(10000);
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    wait_while_held();
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    wait_while_held();
    return real(fd);
}
"""

_LIBRARY: str | None = None
_LOCK = threading.Lock()


def compiler() -> str | None:
    """The C compiler that builds the library (``cc``), or None."""
    return shutil.which("cc") or shutil.which("gcc")


def _library() -> str:
    """The shared library's path, built once per process into a folder deleted at exit.

    :raises RuntimeError: no C compiler, or the build failed (naming its error)."""
    global _LIBRARY
    with _LOCK:
        if _LIBRARY is None or not os.path.exists(_LIBRARY):
            cc = compiler()
            if cc is None:
                raise RuntimeError("FsyncHold needs a C compiler (cc) to build its library")
            folder = tempfile.mkdtemp(prefix="anarchon-fsync-hold-")
            atexit.register(shutil.rmtree, folder, True)
            source = os.path.join(folder, "fsync_hold.c")
            with open(source, "w") as f:
                f.write(_SOURCE)
            library = os.path.join(folder, "fsync_hold.so")
            out = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", library, source, "-ldl"],
                                 capture_output=True, text=True)
            if out.returncode != 0:
                raise RuntimeError(f"building {library} failed: {out.stderr.strip()}")
            _LIBRARY = library
        return _LIBRARY


class FsyncHold:
    """The hold of the servers started with :attr:`env` (see the module docstring).

    :param folder: where the hold's file lives (the rig's folder).
    :raises RuntimeError: the library cannot be built.
    """

    def __init__(self, folder: str) -> None:
        self.path = os.path.join(folder, "fsync-hold")
        #: the environment variables a server needs
        self.env = {"LD_PRELOAD": _library(), "ANARCHON_FSYNC_HOLD": self.path}

    def hold(self) -> None:
        """From now, every fsync of the servers blocks."""
        with open(self.path, "w"):
            pass

    def release(self) -> None:
        """The blocked fsyncs complete (within 10 ms)."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    @property
    def held(self) -> bool:
        return os.path.exists(self.path)
