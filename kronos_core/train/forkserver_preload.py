"""Preloaded by the loader workers' forkserver, and only there: that process ignores SIGINT, SIGTERM and SIGHUP.

Never import this module anywhere else: the importing process would ignore Ctrl-C and SIGTERM from then on.

Loader workers of compiled runs are the forkserver's children (kronos_core.train.loading.worker_context), and
torch's worker loop exits as soon as its parent changes. A SIGTERM to the whole process group (a launcher's,
``kill -- -PGID``) would kill the server (multiprocessing only protects it from SIGINT) and with it every
worker, before the main process reaches the step boundary where it saves. The server still ends after the
main process and its workers (they hold its "alive" pipe; each exits with the main process, see
loading.init_worker). Its children inherit both signals as ignored (it restores SIGINT to what it found at
start), so a worker is deaf to Ctrl-C from birth, not only once its ``worker_init_fn`` has run.
"""

import signal

signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if hasattr(signal, "SIGHUP"):  # a closed terminal hangs up the whole job; the main process decides
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
