"""The operations, as SGLang's scheduler issues them, written as standalone source.

``SOURCE`` is exec'd by the driver after a configuration's source, and pasted with it into a
finding's reproducer, so the reproducer needs only SGLang.  Each operation takes the stack and
small integers (a request index, taken modulo the live ones, a chunk size), so any sequence of
operations is valid and a failing one can be cut down by deleting steps.  The calls follow
``sglang/srt/managers``: a new request is matched (``Req.init_next_round_input`` ->
``match_kv_cache``), admitted only when the allocator and the tree's evictable tokens cover it
(``PrefillAdder``'s budget, taken with the match locked: ``tree.lock(req.last_node)``), allocated
(``ScheduleBatch.prepare_for_extend`` -> ``alloc_for_extend``, which evicts for allocation), then
published (``checkpoint_kv_cache``) after every chunk or prefill; decode steps go through
``prepare_for_decode`` (which frees SWA slots out of the window); a finished request is released
with ``release_kv_cache(checkpoint=True)``, an aborted one without, and a preempted one as
``release_req`` does (release, evict, ``reset_for_retract``) and goes back to the waiting queue.
The model's forward is stood in for by writing a marker (a hash of the prefix ending at that
position) into every state buffer at the slots the step computed.
"""

SOURCE = """
from array import array
from types import SimpleNamespace

import torch
from sglang.srt.managers import schedule_batch as _schedule_batch
from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req, ScheduleBatch
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InitLoadBackParams
import inspect
from sglang.srt.mem_cache import common as _common
from sglang.srt.mem_cache.common import evict_from_tree_cache

# the publish calls by signature: 0.5.22 named them checkpoint_kv_cache and
# release_kv_cache(checkpoint=); 0.5.21 maybe_cache_unfinished_req and release_kv_cache(is_insert=)
if hasattr(_common, "checkpoint_kv_cache"):
    checkpoint_kv_cache = _common.checkpoint_kv_cache
else:
    def checkpoint_kv_cache(req, tree):
        _common.maybe_cache_unfinished_req(req, tree)
if "checkpoint" in inspect.signature(_common.release_kv_cache).parameters:
    release_kv_cache = _common.release_kv_cache
else:
    def release_kv_cache(req, tree, checkpoint):
        _common.release_kv_cache(req, tree, is_insert=checkpoint)
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

# the model config the batch reads: a Mamba stack's model has the Mamba layout's chunk size
MODEL = SimpleNamespace(vocab_size=50000, is_encoder_decoder=False, hf_text_config=SimpleNamespace(
    mamba_chunk_size=globals().get("MAMBA_CHUNK", 64)))


# The request's fields moved between releases (chosen by what the Req has):
def prefix_len(req):
    # 0.5.22 on: Req.prefix_len; before it, the length of the matched device indices
    return req.prefix_len if hasattr(req, "prefix_len") else len(req.prefix_indices)


def prefix_indices(tree, req):
    # 0.5.22 on: the tree resolves the request's device prefix; before it, Req.prefix_indices
    if hasattr(tree, "prefix_device_indices"):
        return tree.prefix_device_indices(req)
    return req.prefix_indices


def set_extend(req, end):
    # 0.5.22 on: Req.extend_end; 0.5.15 to 0.5.21: Req.set_extend_range(start, end); 0.5.13
    # and 0.5.14: Req.fill_len and Req.extend_input_len
    if hasattr(req, "set_extend_range"):
        req.set_extend_range(prefix_len(req), end)
    elif hasattr(req, "fill_len"):
        req.fill_len, req.extend_input_len = end, end - prefix_len(req)
    else:
        req.extend_end = end


def extend_end(req):
    if hasattr(req, "set_extend_range"):
        return req.extend_range.end
    return req.fill_len if hasattr(req, "fill_len") else req.extend_end


def kv_of(req):
    # the request's KV bookkeeping: Req.kv (ReqKvInfo) from 0.5.16, fields of the Req before it
    return getattr(req, "kv", req)


def pool_idx(req):
    # the request's row of req_to_token: on Req.kv from 0.5.19, on the Req before it
    kv = kv_of(req)
    return kv.req_pool_idx if hasattr(kv, "req_pool_idx") else req.req_pool_idx


def owned_kv_len(req):
    # what a finished request stores: its committed KV (Req.owned_kv_len from 0.5.21)
    if hasattr(req, "owned_kv_len"):
        return req.owned_kv_len()
    kv = kv_of(req)  # its committed KV on ReqKvInfo from 0.5.19, on the Req before it
    return kv.kv_committed_len if hasattr(kv, "kv_committed_len") else req.kv_committed_len


def lock_node(tree, node):
    # 0.5.22 on: tree.lock returns a TreeLock; before it, inc_lock_ref's receipt
    if hasattr(tree, "lock"):
        return tree.lock(node)
    return node, tree.inc_lock_ref(node).to_dec_params()


def unlock_node(tree, lock):
    if hasattr(tree, "unlock"):
        return tree.unlock(lock)
    node, receipt = lock
    tree.dec_lock_ref(node, receipt)


def keep_lock(req, lock):
    # the admitted request holds its lock until release_kv_cache: 0.5.22 on as Req.lock, before
    # it as Req.lock_receipt (released on Req.last_node)
    req.lock = lock
    if isinstance(lock, tuple):
        req.last_node, req.lock_receipt = lock


def add_loaded(req, loaded):
    # init_load_back's device part: 0.5.22 on a token count added to Req.prefix_len; before
    # it, the loaded device indices, appended to Req.prefix_indices
    if isinstance(loaded, torch.Tensor):
        req.prefix_indices = torch.cat([req.prefix_indices, loaded])
        return len(loaded)
    req.prefix_len += loaded
    return loaded


def tokens_of(family, n):
    # prompts of one family share their prefix, as real traffic does
    return [(family * 7919 + i * 104729) % 49999 + 1 for i in range(n)]


def markers(tokens):
    # what the slot at position i holds: a hash of the prefix tokens[: i + 1]
    out, h = [], 0x345678
    for t in tokens:
        h = (h * 1000003 + t) % 2147483647
        out.append(h)
    return out


class Stack:
    def __init__(self):
        self.r2t, self.kv, self.alloc, self.tree = make_stack()
        self.states = states(self.kv)
        self.waiting, self.chunked, self.running, self.finished = [], [], [], []
        self.n = 0
        self.on_match = None  # an observer of every hit before it is used (kvstate's checks)
        self.on_loaded = None  # of every prefix once a host load-back into it is complete
        self.hicache = getattr(self.tree, "cache_controller", None) is not None
        self.storage = self.hicache and bool(self.tree.enable_storage)
        # a Mamba stack: its state pool's markers (name -> (read, write) per Mamba slot)
        self.mamba = mamba_states(self.r2t) if hasattr(self.r2t, "mamba_pool") else None
        self.on_resume = None  # of the Mamba state each forward starts from (kvstate's checks)

    def swa_of(self, locs):
        return self.alloc.full_to_swa_index_mapping[locs]

    def fill(self, req):
        return list(req.origin_input_ids) + list(req.output_ids)

    def write_markers(self, req, lo, hi):
        # the forward pass: every state of positions [lo, hi) now holds that prefix
        locs = self.r2t.req_to_token[pool_idx(req), lo:hi].to(torch.int64)
        vals = torch.tensor(markers(self.fill(req)[:hi])[lo:hi], dtype=torch.int64)
        for space, _read, write in self.states.values():
            write(locs if space == "full" else self.swa_of(locs), vals)

    def has_room(self, tokens):
        # PrefillAdder's budget: free plus evictable tokens of both pools, a page per running
        # request kept back for its next decode step
        need = -(-tokens // PAGE) * PAGE + PAGE * (len(self.running) + len(self.chunked))
        return (self.r2t.available_size() > 0 or tokens == 0) and min(
            self.alloc.full_available_size() + self.tree.full_evictable_size(),
            self.alloc.swa_available_size() + self.tree.swa_evictable_size()) >= need

    def extend(self, req):
        batch = ScheduleBatch.init_new([req], self.r2t, self.alloc, self.tree, MODEL, False,
                                       SpeculativeAlgorithm.NONE)
        batch.prepare_for_extend()
        if self.mamba is not None:
            mamba_extend(self, batch, req)
        self.write_markers(req, prefix_len(req), extend_end(req))
        if extend_end(req) < len(req.full_untruncated_fill_ids):
            checkpoint_kv_cache(req, self.tree)  # a chunk: publish it
            self.chunked.append((req, batch))
        else:
            req.output_ids.append(len(req.output_ids) * 31 % 49999 + 1)
            checkpoint_kv_cache(req, self.tree)
            self.running.append((req, batch))

    def chunk_end(self, req, chunk, start=None):
        start = prefix_len(req) if start is None else start
        fill = len(req.full_untruncated_fill_ids)
        if fill - start <= chunk:
            return fill
        return (start + chunk) // PAGE * PAGE


def arrive(st, family, length, tokens=None):
    toks = tokens if tokens is not None else tokens_of(family, length)
    # token ids as an array("q") from 0.5.13 (a list before it: it appends output_ids lists)
    ids = array("q", toks) if hasattr(_schedule_batch, "array") else list(toks)
    req = Req(rid=f"r{st.n}", origin_input_text="", origin_input_ids=ids,
              sampling_params=SamplingParams(temperature=0, max_new_tokens=1 << 20))
    st.n += 1
    queue(st, req)
    return req


def queue(st, req):
    # Scheduler._add_request_to_queue: with L3 storage, a prefetch starts as the request waits
    if st.storage:
        prefetch(st, req)
    st.waiting.append(req)


def prefetch(st, req):
    # Scheduler._prefetch_kvcache (cache mode): from the deepest backed-up node, ask storage
    # for the rest of the prompt
    req.init_next_round_input(st.tree, cow_mamba=False)
    node, tree = req.last_host_node, st.tree
    matched = prefix_len(req) + req.host_hit_length
    if tree.is_backuped(node) or tree.is_root(node):
        end = req._compute_max_prefix_len(len(req.full_untruncated_fill_ids))
        tree.prefetch_from_storage(
            req.cache_request_handle, node, req.full_untruncated_fill_ids[matched:end],
            tree.get_last_hash_value(node), None,
            matched_prefix_tokens=req.full_untruncated_fill_ids[:matched],
            extra_key=req.extra_key, cache_salt=req.cache_salt, storage_hit_end=None)


def poll(st, seconds=2.0):
    # idle scheduler turns while L3 backups are written and prefetches run (wait_complete)
    import time
    if not st.storage:
        return None
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        tick(st)
        if not st.tree.ongoing_backup and all(
                st.tree.check_prefetch_progress(r.cache_request_handle) for r in st.waiting):
            break  # the storage backups written, every waiting request's prefetch done
        time.sleep(0.002)
    return True


def cancel(st, i):
    # a waiting request aborted: Scheduler._release_aborted_request ends its prefetch
    if not st.waiting:
        return None
    from sglang.srt.mem_cache.base_prefix_cache import CacheRequestOutcome
    req = st.waiting.pop(i % len(st.waiting))
    st.tree.finish(req.cache_request_handle, CacheRequestOutcome.ABORT)
    return req


def lose_file(st, k):
    # a fault: one file of L3 storage removed (k picks it) or, for odd k, cut to half its size
    import os
    if not st.storage:
        return None
    import time
    deadline = time.monotonic() + 5.0
    while st.tree.ongoing_backup and time.monotonic() < deadline:
        tick(st)  # the backups already issued reach their files first
        time.sleep(0.002)
    root = os.environ["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"]
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)
    if not files:
        return None
    path = files[(k // 2) % len(files)]
    if k % 2:
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
    else:
        os.remove(path)
    return path


def drop_sidecar(st, k):
    # a fault: one L3 file of an indexer pool (DeepSeek-V4's sidecar of the compressed KV) is
    # lost while the compressed KV's own files stay: a prefetch of that prefix stops partway
    # for the sidecar only (k picks the file; nothing to drop without an indexer pool)
    import os
    if not st.storage:
        return None
    import time
    deadline = time.monotonic() + 5.0
    while st.tree.ongoing_backup and time.monotonic() < deadline:
        tick(st)
        time.sleep(0.002)
    root = os.environ["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"]
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs
                   if "indexer" in f)
    if not files:
        return None
    path = files[k % len(files)]
    os.remove(path)
    return path


def close(st):
    # the end of a stack: stop HiCache's storage threads (a server stops them at exit)
    if st.storage:
        try:
            st.tree.cache_controller._stop_storage_threads()
        except RuntimeError:  # a join that timed out: the threads are daemons, left to exit
            pass
        import os
        import shutil
        shutil.rmtree(os.environ["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"], ignore_errors=True)


def resend(st, j):
    # a new request for exactly what a finished one stored
    if not st.finished:
        return None
    req = arrive(st, 0, 0, st.finished[j % len(st.finished)])
    req.resend_of = j % len(st.finished)
    return req


def tick(st):
    # the scheduler's loop polls HiCache's write-through acks and load-back events every turn
    if st.hicache:
        st.tree.check_hicache_events()
    return st.hicache or None


def drain(st, seconds=5.0):
    # idle scheduler turns: poll until no write-through or load-back is in flight (each holds
    # a device lock on its node until acked)
    import time
    deadline = time.monotonic() + seconds
    while st.hicache and (st.tree.ongoing_write_through or st.tree.ongoing_load_back):
        if time.monotonic() > deadline:
            break
        tick(st)
        time.sleep(0.0005)


def load_back(st, req, lock):
    # PrefillAdder.add_one_req: pin the host match, init_load_back, lock the loaded node; then
    # the scheduler starts the H2D copy (ready_to_load_host_cache) and the forward waits for it
    best = req.best_match_node
    pin = st.tree.inc_host_lock_ref(best).to_dec_params()
    try:
        got = st.tree.init_load_back(InitLoadBackParams(
            best_match_node=best, host_hit_length=req.host_hit_length, req=req))
    finally:
        st.tree.dec_host_lock_ref(best, pin)
    loaded, last = got if got is not None else (0, req.last_node)  # None: nothing loaded
    req.last_node = last
    req.host_loaded_length = loaded = add_loaded(req, loaded)
    owned = getattr(st.tree, "load_back_is_cache_owned", lambda: True)  # always, before 0.5.22
    if owned():
        kv_of(req).cache_protected_len = prefix_len(req)  # the loaded slots are the tree's
    if loaded:
        new = lock_node(st.tree, last)
        unlock_node(st.tree, lock)
        lock = new
    event = st.tree.ready_to_load_host_cache()
    if loaded and st.on_loaded is not None:
        st.on_loaded(req, event)
    return lock


def admit(st, i, chunk):
    if not st.waiting:
        return None
    tick(st)
    if st.r2t.available_size() == 0:
        return None  # get_new_batch_prefill: no free request row, the batch is full (no match)
    req = st.waiting[i % len(st.waiting)]
    if st.storage:  # get_new_batch_prefill: a request whose prefetch is running waits
        if not st.tree.check_prefetch_progress(req.cache_request_handle):
            return None
        req.storage_hit_length, _ = st.tree.pop_prefetch_loaded_span(req.cache_request_handle)
    req.init_next_round_input(st.tree)  # match_kv_cache
    hit = (prefix_len(req), prefix_indices(st.tree, req).clone())
    if st.on_match is not None:
        st.on_match(req, hit)  # an observer (kvstate's checks) sees the hit before it is used
    load = st.hicache and req.needs_host_load_back()
    end = st.chunk_end(req, chunk, prefix_len(req) + (req.host_hit_length if load else 0))
    if end <= prefix_len(req):
        unmatch_mamba(st, req)
        return None
    lock = lock_node(st.tree, req.last_node)  # locked first: its prefix is not evictable
    if not st.has_room(end - prefix_len(req)):  # the host hit's load-back takes device slots too
        unlock_node(st.tree, lock)  # the adder leaves it waiting
        unmatch_mamba(st, req)
        return None
    if load:
        lock = load_back(st, req, lock)
        end = max(end, st.chunk_end(req, chunk))  # a load short of the promise recomputes
    st.waiting.remove(req)
    set_extend(req, end)
    keep_lock(req, lock)
    st.extend(req)
    return req, hit


def next_chunk(st, i, chunk):
    if not st.chunked:
        return None
    req, _ = st.chunked[i % len(st.chunked)]
    req.init_next_round_input()  # a continuing chunk: no new match, no new lock
    end = st.chunk_end(req, chunk)
    if end <= prefix_len(req) or not st.has_room(end - prefix_len(req)):
        return None
    st.chunked = [c for c in st.chunked if c[0] is not req]
    set_extend(req, end)
    st.extend(req)
    return req


def decode(st, i, steps):
    if not st.running:
        return None
    req, batch = st.running[i % len(st.running)]
    for _ in range(steps):
        if len(st.fill(req)) >= MAX_LEN:
            return None  # at the context length the scheduler finishes it instead
        if not st.has_room(1):
            return None
        batch.prepare_for_decode()
        pos = int(batch.seq_lens_cpu[0]) - 1
        st.write_markers(req, pos, pos + 1)
        if st.mamba is not None:
            mamba_decode(st, batch, req, pos)
        req.output_ids.append((pos * 31 + len(req.output_ids)) % 49999 + 1)
        if st.mamba is not None:
            mamba_after_decode(st, batch, req)
    return req


def finish(st, i):
    if not st.running:
        return None
    req, _ = st.running.pop(i % len(st.running))
    req.finished_reason = FINISH_LENGTH(length=len(req.output_ids))
    stored = owned_kv_len(req)
    release_kv_cache(req, st.tree, checkpoint=True)
    st.finished.append(st.fill(req)[:stored])
    return req


def abort(st, i):
    live = st.running + st.chunked
    if not live:
        return None
    req, _ = live[i % len(live)]
    st.running = [c for c in st.running if c[0] is not req]
    st.chunked = [c for c in st.chunked if c[0] is not req]
    req.finished_reason = FINISH_LENGTH(length=len(req.output_ids))
    release_kv_cache(req, st.tree, checkpoint=False)
    return req


def preempt(st, i):
    # release_req: give the KV back unpublished, evict for the others, wait to be re-admitted
    if not st.running:
        return None
    req, _ = st.running.pop(i % len(st.running))
    release_kv_cache(req, st.tree, checkpoint=False)
    evict_from_tree_cache(st.tree, len(st.running) * PAGE)
    req.reset_for_retract()
    queue(st, req)
    return req


def unmatch_mamba(st, req):
    # Scheduler.get_new_batch_prefill, a request the adder did not add: the match's Mamba
    # copy-on-write and clear are dropped and its freshly allocated Mamba slot is freed
    if st.mamba is None:
        return
    kv = kv_of(req)
    kv.mamba_cow_src_index = None
    kv.mamba_needs_clear = False
    if kv.holds_mamba:
        st.r2t.mamba_allocator.free(kv.mamba_pool_idx.unsqueeze(-1))
        kv.mamba_pool_idx = None


def mamba_write(st, slots, value):
    # the forward writes a Mamba state: every Mamba buffer of those slots holds that prefix
    slots = st.r2t.translate_mamba_indices(slots.reshape(-1).to(torch.int64))
    vals = torch.full((len(slots),), value, dtype=torch.int64)
    for _read, write in st.mamba.values():
        write(slots.to(torch.int64), vals)


def mamba_extend(st, batch, req):
    # an extend forward of a Mamba stack.  First what ModelRunner's
    # _maybe_execute_deferred_mamba_cow_and_clear runs on the forward stream before the Mamba
    # layers read the pool (its module imports the server's web stack, so its two pool calls
    # are made here): the match's copy-on-write of the cached state into the request's slot,
    # the clear of a fresh slot.  Then the forward's writes: the running state at the extend's
    # end; with the extra buffer, the state at the tracked position (prepare_for_extend set
    # mamba_last_track_seqlen and the ping-pong slot) into the tracking slot.
    pool = st.r2t
    if batch.mamba_clear_indices is not None and len(batch.mamba_clear_indices) > 0:
        pool.mamba_pool.clear_slots(pool.translate_mamba_indices(batch.mamba_clear_indices))
    if batch.mamba_cow_src_indices is not None and len(batch.mamba_cow_src_indices) > 0:
        pool.copy_mamba_state(pool.translate_mamba_indices(batch.mamba_cow_src_indices),
                              pool.translate_mamba_indices(batch.mamba_cow_dst_indices))
    batch.mamba_clear_indices = batch.mamba_cow_src_indices = batch.mamba_cow_dst_indices = None
    lo, hi = prefix_len(req), extend_end(req)
    if st.on_resume is not None:
        st.on_resume(req, lo)  # the state the Mamba layers start from: the prefix's
    m = markers(st.fill(req)[:hi])
    mamba_write(st, kv_of(req).mamba_pool_idx, m[hi - 1])
    if batch.mamba_track_mask is not None and bool(batch.mamba_track_mask[0]):
        mamba_write(st, batch.mamba_track_indices[:1], m[kv_of(req).mamba_last_track_seqlen - 1])


def mamba_decode(st, batch, req, pos):
    # a decode forward's Mamba writes: the running state at pos; with the extra buffer, at a
    # track boundary (prepare_for_decode's mamba_track_mask_cpu) the tracking slot too
    m = markers(st.fill(req)[: pos + 1])[pos]
    mamba_write(st, kv_of(req).mamba_pool_idx, m)
    if batch.mamba_track_mask_cpu is not None and batch.mamba_track_mask_cpu[0]:
        mamba_write(st, batch.mamba_track_indices[:1], m)


def mamba_after_decode(st, batch, req):
    # the scheduler's post-forward bookkeeping (SchedulerBatchResultProcessor.
    # _handle_finish_state_updated_req, its Mamba part, non-lazy extra buffer, results processed
    # before the next batch: lookahead 0): at a completed track boundary the tracked slot and
    # seqlen become the request's last tracked state, then _mamba_prefix_cache_update (SGLang's)
    # swaps the ping-pong slot the next forward writes
    from sglang.srt.managers.scheduler_components.batch_result_processor import (
        SchedulerBatchResultProcessor)
    if batch.mamba_track_mask_cpu is None:
        return  # no_buffer: nothing is tracked
    kv = kv_of(req)
    lookahead = req.decode_batch_idx - batch.mamba_decode_batch_idx_cpu[0]
    boundary = bool(batch.mamba_track_mask_cpu[0])
    if boundary:
        kv.mamba_last_track_idx = batch.mamba_track_buffer_indices[0]
        kv.mamba_prev_track_seqlen = kv.mamba_last_track_seqlen
        kv.mamba_last_track_seqlen = kv.kv_committed_len - lookahead
        proc = object.__new__(SchedulerBatchResultProcessor)
        object.__setattr__(proc, "tree_cache", st.tree)  # a frozen dataclass
        proc._mamba_prefix_cache_update(req, batch, None, 0, known_boundary=True)


def evict(st, tokens):
    return st.tree.evict(EvictParams(num_tokens=tokens, swa_num_tokens=tokens))


def evict_host(st, tokens):
    # host pool pressure: HiCache drops host-only prefixes (L2)
    if not st.hicache:
        return None
    tick(st)
    return st.tree.evict_host(tokens)
"""
