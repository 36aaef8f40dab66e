"""Examples as the trainer reads them (tokenized and aligned rows), made on first use in chunks of
64, so that a large data set is never held as rows all at once and is prepared in the training
thread, where a stop request is answered between chunks."""
from __future__ import annotations

from .batches import prepare


class PreparedRows:
    """Rows of a sequence of examples, each made (tokenized and aligned) on first use, in chunks:
    a large data set is never held as rows all at once."""

    CHUNK = 64

    def __init__(self, calm, examples, max_length: int | None, append_eos: bool, max_chunks: int | None = None):
        self.calm, self.examples, self.max_length, self.append_eos = calm, examples, max_length, append_eos
        self.max_chunks = max_chunks  # None: keep every prepared chunk; else drop the oldest beyond this
        self._chunks: dict[int, list] = {}
        self._cut: dict[int, int] = {}  # truncated examples per chunk ever prepared

    @property
    def truncated(self) -> int:
        return sum(self._cut.values())

    def __len__(self) -> int:
        return len(self.examples)

    @property
    def complete(self) -> bool:
        return len(self._chunks) * self.CHUNK >= len(self.examples)

    def _chunk(self, start: int) -> list:
        if start not in self._chunks:
            rows, cut = prepare(self.calm, list(self.examples[start:start + self.CHUNK]), self.max_length, self.append_eos)
            self._chunks[start], self._cut[start] = rows, cut
            if self.max_chunks is not None and len(self._chunks) > self.max_chunks:
                del self._chunks[next(iter(self._chunks))]  # rows are a pure function of their examples
        return self._chunks[start]

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        start = index // self.CHUNK * self.CHUNK
        return self._chunk(start)[index - start]

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def prepare_chunks(self):
        """Prepare every chunk; yields the rows done after each."""
        for start in range(0, len(self), self.CHUNK):
            self._chunk(start)
            yield min(len(self), start + self.CHUNK)

    def prepare_all(self) -> None:
        for _ in self.prepare_chunks():
            pass
