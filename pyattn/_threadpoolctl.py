"""pyattn's thread pool as a threadpoolctl library (threadpoolctl is optional).

Imported by ``pyattn`` when threadpoolctl is installed, so that
``threadpoolctl.threadpool_info()`` lists pyattn beside OpenBLAS and OpenMP,
and ``threadpool_limits(1)`` (or ``user_api="pyattn"``) caps its threads for
a block and restores them after. threadpoolctl finds the loaded extension
(``pyattn/_C*.so``) and calls its two exported functions through ctypes, as
it does for the BLAS libraries.
"""
import ctypes

from threadpoolctl import LibController, register  # type: ignore  # (no type information)


class PyattnController(LibController):
    user_api = "pyattn"
    internal_api = "pyattn"
    filename_prefixes = ("_c.",)          # file names are compared in lower case
    check_symbols = ("pyattn_threadpool_get_num_threads", "pyattn_threadpool_set_num_threads")

    def get_num_threads(self):
        return self.dynlib.pyattn_threadpool_get_num_threads()

    def set_num_threads(self, num_threads):
        return self.dynlib.pyattn_threadpool_set_num_threads(ctypes.c_int(int(num_threads)))

    def get_version(self):
        from . import __version__
        return __version__


register(PyattnController)
