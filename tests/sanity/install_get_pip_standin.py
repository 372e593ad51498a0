"""Install an offline stand-in for the pip bootstrap script ansible-test downloads.

ansible-test builds its sanity virtual environments with ``get_pip_<version>.py`` fetched from the
internet; where only the package registries are reachable that download fails. The stand-in does the
same job with the interpreter's own ``ensurepip`` and then installs what ansible-test asked for.
"""
from __future__ import annotations

import os
import sys

STANDIN = '''\
import ensurepip, subprocess, sys
ensurepip.bootstrap()
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
if args:
    subprocess.check_call([sys.executable, "-m", "pip", "install",
                           "--cert", "/etc/ssl/certs/ca-certificates.crt"] + args)
'''


def main():
    from ansible_test._internal.python_requirements import get_venv_packages

    class _Py:  # the only attribute get_venv_packages reads
        version = "%d.%d" % sys.version_info[:2]

    pip_version = get_venv_packages(_Py())["pip"]
    cache = os.path.expanduser("~/.ansible/test/cache")
    os.makedirs(cache, exist_ok=True)
    path = os.path.join(cache, "get_pip_%s.py" % pip_version.replace(".", "_"))
    with open(path, "w") as f:
        f.write(STANDIN)
    print("pip bootstrap stand-in: %s" % path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
