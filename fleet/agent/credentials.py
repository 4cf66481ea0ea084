"""The agent's credential: the cluster's join token until its node has its own, then that.

The control plane answers a node's first `register` with `node_token`, the node's own
credential, shown once. It is kept in the state folder (0600) and sent from then on; a
join token cannot register that node id again. When the control plane refuses the node's
credential (an operator forgot the node, or this is a new control plane), the agent forgets
it and joins again with the join token, if it was given one, as kubelet bootstraps again.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

FILE_NAME = "node-token"
_LONGEST = 200


class Credentials:
    """Where the node's credential is kept, and the join token to fall back on."""

    def __init__(self, state_dir: Path, join_token: str | None) -> None:
        self.path = state_dir / FILE_NAME
        self.join_token = join_token or None
        self._node_token = self._read()

    def _read(self) -> str | None:
        try:
            text = self.path.read_text().strip()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("cannot read this node's credential from %s: %s", self.path, exc)
            return None
        if not text or len(text) > _LONGEST or not text.isprintable():
            log.warning("%s does not hold a credential; it is ignored", self.path)
            return None
        return text

    @property
    def joined(self) -> bool:
        """Whether this node has its own credential."""
        return self._node_token is not None

    def __call__(self) -> str:
        """The bearer to send now: the node's own credential, else the join token."""
        return self._node_token or self.join_token or ""

    def keep(self, node_token: str) -> None:
        """Keep the credential the control plane issued: written whole beside the file, owner
        only, then moved into place, so a crash never leaves half of it."""
        if not isinstance(node_token, str) or not node_token or len(node_token) > _LONGEST:
            log.warning("the control plane sent a node_token that is not one; it is ignored")
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{FILE_NAME}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(node_token + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self._node_token = node_token
        log.info("this node was given its own credential, kept in %s", self.path)

    def refused(self) -> bool:
        """The control plane refused the node's credential: forget it and fall back on the
        join token. Whether there is one to fall back on."""
        if self._node_token is None:
            return False
        if self.join_token is None:
            log.error(
                "the control plane refused this node's credential (%s): the node was forgotten "
                "or the control plane is new; start the agent with the join token "
                "(LLMGW_TOKEN) to join again",
                self.path,
            )
            return False
        log.warning(
            "the control plane refused this node's credential (the node was forgotten, or the "
            "control plane is new); joining again with the join token"
        )
        self.path.unlink(missing_ok=True)
        self._node_token = None
        return True
