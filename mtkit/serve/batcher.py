"""Dynamic batching: requests that arrive together are decoded together, in ``threads`` decoding threads
per model (two by default, ``mtkit serve --decoding-threads``).

A request becomes a :class:`Job` (its lines, decode settings and per-line constraints, if any) in
the model's bounded queue. The model's decoding thread takes the oldest job, waits until it is
``max_wait`` old for others with the same settings, takes them in arrival order up to
``batch_tokens`` source tokens (at least one job; their constraints travel with their lines), and
translates all their lines in one :meth:`Engine.translate` call: it
sorts them by length and cuts its own token-budget batches (``decode.batch_tokens``), gives one
result per line (an empty line an empty translation, an over-long line truncated with a
warning), in order. Each job gets its slice back through a :class:`concurrent.futures.Future`,
which the event loop awaits: inference never runs on the event loop.

A decoding thread never dies of a job: a job whose tokens cannot be counted fails alone; a batch
whose decoding fails is decoded again job by job, so that only the job that broke it fails (its
request answers 500); the thread takes the next job.

Work nobody waits for is dropped: a job has a deadline (``decode_timeout`` seconds after it arrived)
and can be abandoned (its request timed out, or its client went away: :meth:`Batcher.abandon`). An
abandoned job leaves the queue at once; a batch being decoded stops between two search steps once
each of its jobs is abandoned or past its deadline (its requests get :class:`Stopped`).
:meth:`Batcher.moving` says whether the queue moves: False when a thread has decoded one batch for
longer than ``stall_after`` seconds (a deadline stops it long before), or the oldest queued job has
waited that long while no batch finished.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field

from mtkit.config import DecodeConfig
from mtkit.engines.constraints import Constraints
from mtkit.engines.engine import Stopped, Translation
from mtkit.errors import counted
from mtkit.serve.models import ServedModel
from mtkit.text.pipeline import translate_lines

logger = logging.getLogger(__name__)


class QueueFull(Exception):
    """The model's queue holds ``max_queue`` jobs (or the server is stopping): try again later."""


class JobFuture(Future):
    """A job's result (one :class:`Translation` per line), which its request may give up on."""

    def __init__(self) -> None:
        super().__init__()
        self.abandoned = False

    def abandon(self) -> None:
        """Nobody waits for this result any more: the job is not started, or stops between search steps."""
        self.abandoned = True
        self.cancel()


@dataclass
class Job:
    lines: list[str]
    decode: DecodeConfig
    future: JobFuture = field(default_factory=JobFuture)
    arrived: float = field(default_factory=time.monotonic)  # the batcher's clock's time (its deadline's)
    # time.monotonic() at arrival: the batching window waits in real time, whatever the batcher's clock
    received: float = field(default_factory=time.monotonic)
    deadline: float | None = None  # the clock's time after which nobody waits for it (None: none)
    tokens: int | None = None  # source tokens, counted by the decoding thread
    constraints: list[Constraints | None] | None = None  # per line (None: no line has any)


@dataclass(frozen=True)
class BatchPolicy:
    """How a :class:`Batcher` queues and merges jobs.

    Attributes:
        max_queue: jobs waiting at most (beyond it :meth:`Batcher.submit` raises :class:`QueueFull`).
        max_wait: seconds a job waits for others to join it.
        batch_tokens: source tokens merged into one decoding call at most (None: the model's
            ``decode.batch_tokens``).
        threads: decoding threads (batches decoded at the same time).
        decode_timeout: seconds after its arrival at which a job is stopped (None: never).
        stall_after: seconds after which a batch still decoding, or the oldest queued job with no batch
            finished meanwhile, means the queue is not moving (None: never; see :meth:`Batcher.moving`).
    """

    max_queue: int = 256
    max_wait: float = 0.0
    batch_tokens: int | None = None
    threads: int = 1
    decode_timeout: float | None = None
    stall_after: float | None = None


@dataclass
class BatchStats:
    """What one decoding call did, for the metrics."""

    model: str
    sentences: int
    src_tokens: int
    tgt_tokens: int
    seconds: float


class Batcher:
    """A model's queue and its decoding thread.

    Args:
        model: the served model.
        policy: how jobs are queued and merged (:class:`BatchPolicy`).
        on_batch: called with a :class:`BatchStats` after each decoding call.
        on_queue: called with the queue length whenever it changes.
        clock: the time in seconds (``time.monotonic``; tests give their own).
    """

    def __init__(self, model: ServedModel, policy: BatchPolicy | None = None,
                 on_batch: Callable[[BatchStats], None] | None = None, on_queue: Callable[[int], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        policy = policy or BatchPolicy()
        threads = policy.threads
        self.model = model
        self.decode_timeout = policy.decode_timeout
        self.stall_after = policy.stall_after
        self.clock = clock
        self._busy: dict[int, float] = {}  # decoding thread -> when it took its batch
        self._last_done = clock()  # when a batch last finished (or stopped)
        self.max_queue = policy.max_queue
        self.max_wait = policy.max_wait
        self.batch_tokens = policy.batch_tokens or model.decode.batch_tokens
        self.on_batch = on_batch or (lambda stats: None)
        self.on_queue = on_queue or (lambda n: None)
        self._pending: deque[Job] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._threads = [threading.Thread(target=self._run, name=f"mtkit-serve-{model.name}-{i}", daemon=True)
                         for i in range(max(1, threads))]

    # ------------------------------------------------------------------ the event loop's side

    def start(self) -> None:
        self._last_done = self.clock()
        for thread in self._threads:
            thread.start()

    @property
    def alive(self) -> bool:
        return all(thread.is_alive() for thread in self._threads) and not self._stopping

    def queue_length(self) -> int:
        return len(self._pending)

    def decoding(self) -> int:
        """Batches being decoded now."""
        return len(self._busy)

    def moving(self) -> bool:
        """False when the queue is stuck: a thread has decoded one batch for over ``stall_after`` seconds,
        or the oldest queued job has waited that long while no batch finished."""
        if self.stall_after is None:
            return True
        now = self.clock()
        with self._cond:
            if any(now - began > self.stall_after for began in list(self._busy.values())):
                return False
            oldest = self._pending[0].arrived if self._pending else None
            return oldest is None or now - oldest <= self.stall_after or now - self._last_done <= self.stall_after

    def submit(self, lines: list[str], decode: DecodeConfig,
               constraints: list[Constraints | None] | None = None) -> JobFuture:
        """Queue ``lines`` for translation; the future gives one :class:`Translation` per line, in order
        (or raises :class:`Stopped` when its deadline passed first)."""
        now = self.clock()
        job = Job(list(lines), decode, constraints=constraints, arrived=now,
                  deadline=None if self.decode_timeout is None else now + self.decode_timeout)
        with self._cond:
            if self._stopping:
                raise QueueFull("the server is stopping")
            if len(self._pending) >= self.max_queue:
                raise QueueFull(f"the queue of model {self.model.name} is full ({counted(self.max_queue, 'request')})")
            self._pending.append(job)
            self.on_queue(len(self._pending))
            self._cond.notify()
        return job.future

    def abandon(self, future: Future) -> None:
        """Nobody waits for ``future`` (a request that timed out, a client that went away): its job leaves
        the queue, or, being decoded, stops between search steps once its batch holds no other job."""
        if isinstance(future, JobFuture):
            future.abandon()
        with self._cond:
            for job in self._pending:
                if job.future is future:
                    self._pending.remove(job)
                    self.on_queue(len(self._pending))
                    break

    def stop(self, timeout: float | None = None) -> None:
        """Decode what is queued, then end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout)

    # ------------------------------------------------------------------ the decoding thread

    def _count_tokens(self, job: Job) -> int:
        if job.tokens is None:
            job.tokens = sum(len(ids) + 1 for ids in self.model.translator.vocab.encode_src_batch(job.lines))
        return job.tokens

    def _next_compatible(self, decode: DecodeConfig) -> Job | None:
        """Remove and return the oldest queued job with these settings (under the lock)."""
        for i, job in enumerate(self._pending):
            if job.decode == decode:
                del self._pending[i]
                self.on_queue(len(self._pending))
                return job
        return None

    def _counted(self, job: Job) -> int | None:
        """``job``'s source tokens; None, with the job failed, when they cannot be counted (bad text)."""
        try:
            return self._count_tokens(job)
        except Exception as e:  # noqa: BLE001 - that request fails, the batch goes on
            _fail(job, e)
            return None

    def _gather(self, taken: list[Job]) -> bool:
        """Put the next batch of jobs in ``taken`` (False: stopped with nothing left). Every job taken
        from the queue is in ``taken`` at once, so that an error on the way still answers it."""
        with self._cond:
            while not self._pending and not self._stopping:
                self._cond.wait()
            if not self._pending:
                return False
            first = self._pending.popleft()
            taken.append(first)
            self.on_queue(len(self._pending))
        # Alone and with no wait, the first job is never counted: a one-line request skips an encoding.
        tokens = self._first_tokens(first, taken) if self.max_wait > 0 else None
        deadline = first.received + self.max_wait
        while tokens is None or tokens < self.batch_tokens:
            with self._cond:
                job = self._next_compatible(first.decode)
                while job is None and not self._stopping:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
                    job = self._next_compatible(first.decode)
            if job is None:
                break
            taken.append(job)
            if tokens is None:
                tokens = self._first_tokens(first, taken)
            more = self._counted(job)
            if more is None:
                taken.remove(job)
            elif tokens + more > self.batch_tokens and len(taken) > 1:
                taken.remove(job)
                with self._cond:  # it starts the next batch
                    self._pending.appendleft(job)
                    self.on_queue(len(self._pending))
                break
            else:
                tokens += more
        return True

    def _first_tokens(self, first: Job, taken: list[Job]) -> int:
        """The first job's tokens (0, with the job failed and out of ``taken``, when they cannot be counted)."""
        tokens = self._counted(first)
        if tokens is None:
            taken.remove(first)
            return 0
        return tokens

    def _run(self) -> None:
        """The decoding thread's loop: it ends only when the batcher stops. Whatever a job raises (while
        its tokens are counted, decoded or answered) fails that job's request, never the thread."""
        while True:
            jobs: list[Job] = []
            try:
                if not self._gather(jobs):
                    return
                if jobs:
                    self._busy[threading.get_ident()] = self.clock()
                    self._decode(jobs)
            except BaseException as e:  # noqa: BLE001 - the requests get the error, the thread goes on
                for job in jobs:
                    _fail(job, e)
            finally:
                if self._busy.pop(threading.get_ident(), None) is not None:
                    self._last_done = self.clock()

    def _decode(self, jobs: list[Job]) -> None:
        jobs = [job for job in jobs if job.future.set_running_or_notify_cancel()]  # the client may have gone
        if not jobs:
            return
        try:
            self._answer(jobs)
        except Stopped as e:  # nobody waits for any of them: no job is tried again
            for job in jobs:
                _fail(job, e)
        except Exception:  # noqa: BLE001 - one job's text broke the batch: each job alone, so only it fails
            if len(jobs) == 1:
                raise
            for job in jobs:
                try:
                    self._answer([job])  # a job nobody waits for stops at once (Stopped)
                except Exception as e:  # noqa: BLE001
                    _fail(job, e)

    def _unwanted(self, jobs: list[Job]) -> bool:
        """Whether every job is abandoned or past its deadline (its batch stops: :class:`Stopped`)."""
        now = self.clock()
        return all(job.future.abandoned or (job.deadline is not None and now > job.deadline) for job in jobs)

    def _answer(self, jobs: list[Job]) -> None:
        """Translate the jobs' lines in one call and give each job its slice."""
        lines = [line for job in jobs for line in job.lines]
        start = time.perf_counter()
        merged = [c for job in jobs for c in (job.constraints or [None] * len(job.lines))]
        wanted = _per_line(merged) if any(merged) else None
        results: list[Translation] = list(translate_lines(
            self.model.translator, lines, buffer_size=max(1, len(lines)), constraints=wanted, options=jobs[0].decode,
            target=self.model.target, should_stop=lambda: self._unwanted(jobs)))
        if len(results) != len(lines):  # the engines' guarantee; never answer a request with another's
            raise RuntimeError(f"{len(lines)} lines gave {len(results)} translations")
        seconds = time.perf_counter() - start
        offset = 0
        for job in jobs:
            job.future.set_result(results[offset : offset + len(job.lines)])
            offset += len(job.lines)
        try:
            self.on_batch(BatchStats(
                self.model.name, len(lines), sum(len(t.src_ids) for t in results),
                sum(len(t.best.ids) + 1 for t in results if t.src_ids), seconds))
        except Exception as e:  # noqa: BLE001 - the requests are answered; the metrics lose one batch
            logger.warning(f"warning: the batch metrics failed: {type(e).__name__}: {e}")


def _fail(job: Job, error: BaseException) -> None:
    """Fail ``job``'s request with ``error`` (a job already answered or cancelled keeps its outcome)."""
    if job.future.done():
        return
    try:
        job.future.set_exception(error)
    except InvalidStateError:  # answered or cancelled meanwhile
        pass


def _per_line(found: list[Constraints | None]):
    """The constraint source of :meth:`Engine.translate` that gives line ``i`` ``found[i]``."""
    return lambda index, line: found[index]
