"""A shared-memory broadcast channel: rank 0 writes one pickle, every worker reads it."""
import logging
import pickle
import struct
from multiprocessing.shared_memory import SharedMemory

logger = logging.getLogger(__name__)

# First size of the call segment; a bigger message grows it (see ShmChannel.send).
SHM_BYTES = 1 << 20


class ShmChannel:
    """One writer (rank 0) broadcasts pickles to readers through a shared-memory segment.

    Layout: header (kind, nbytes), then nbytes of body. kind MESSAGE: the body is the
    pickle. kind MOVED: the body is the name of a new, bigger segment that holds the
    message; readers switch to it for good. The caller makes sure readers are done with
    one message before the next is written (the done semaphores), so no locking is needed.
    """

    HEADER = struct.Struct("<IQ")
    MESSAGE, MOVED = 0, 1

    def __init__(self, shm: SharedMemory, owner: bool):
        self.shm, self.owner = shm, owner

    @classmethod
    def create(cls, size: int | None = None) -> "ShmChannel":
        """A new segment (SHM_BYTES by default) owned, and finally unlinked, by this process."""
        size = SHM_BYTES if size is None else size  # read now: tests shrink SHM_BYTES
        return cls(SharedMemory(create=True, size=max(size, cls.HEADER.size)), owner=True)

    @classmethod
    def attach(cls, name: str) -> "ShmChannel":
        """A reader's view of the writer's segment."""
        return cls(SharedMemory(name=name), owner=False)

    @property
    def name(self) -> str:
        """The shared-memory segment's name (what attach() takes)."""
        return self.shm.name

    def send(self, obj) -> None:
        """Write obj for the readers, growing the segment if it does not fit."""
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        need = self.HEADER.size + len(data)
        if need <= self.shm.size:
            self._write(self.shm, self.MESSAGE, data)
            return
        size = self.shm.size
        while size < need:
            size *= 2
        new = SharedMemory(create=True, size=size)
        self._write(new, self.MESSAGE, data)
        self._write(self.shm, self.MOVED, new.name.encode())
        # Readers keep the old segment mapped until they have read the redirect, so the
        # name can go now (POSIX shared memory lives until its last mapping is gone).
        old, self.shm = self.shm, new
        old.close()
        old.unlink()
        logger.debug("call segment grown to %d bytes for a %d-byte message", size, len(data))

    def recv(self):
        """Read the current message (following a move to a bigger segment)."""
        kind, n = self.HEADER.unpack_from(self.shm.buf, 0)
        if kind == self.MOVED:
            name = bytes(self.shm.buf[self.HEADER.size: self.HEADER.size + n]).decode()
            self.shm.close()
            self.shm = SharedMemory(name=name)
            kind, n = self.HEADER.unpack_from(self.shm.buf, 0)
        view = self.shm.buf[self.HEADER.size: self.HEADER.size + n]
        try:
            return pickle.loads(view)
        finally:
            view.release()  # an exported view would make close() fail

    def close(self) -> None:
        """Unmap; the owner also removes the segment. Idempotent."""
        if self.shm is None:
            return
        shm, self.shm = self.shm, None
        shm.close()
        if self.owner:
            try:
                shm.unlink()
            except FileNotFoundError:
                pass

    def _write(self, shm: SharedMemory, kind: int, body: bytes) -> None:
        shm.buf[self.HEADER.size: self.HEADER.size + len(body)] = body
        self.HEADER.pack_into(shm.buf, 0, kind, len(body))
