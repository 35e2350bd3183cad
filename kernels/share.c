/*
 * share.c - parameters shared with other processes on one machine (manta_kernels.h): a share
 * is one allocation of the back-end's memory, a stamp (mk__share_stamp: version, n) then n
 * floats, that the back-end exports (ipc_export) and another process maps (ipc_open).
 *
 * The stamp is a seqlock.  The writer (mk_share_fill) stamps -1, copies, then stamps the
 * version, waiting for each step to land before the next starts; the reader
 * (mk_model_write_params_shared) reads the stamp, copies, and reads the stamp again, each step
 * done before the next.  A writer's copy that overlaps the reader's copy started after the -1
 * landed and ends before the new version lands, so the reader's second reading is -1 or the new
 * version: a mix of two versions is always reported.  (Filling the same version twice with the
 * same parameters is no mix.)
 *
 * Ordering on CUDA (cuda_ops.cu; the library is compiled without --default-stream per-thread):
 * upload, download and copy are cudaMemcpy on the legacy default stream, in the order issued;
 * the kernels run on MK_STREAM, the per-thread default stream, a blocking stream, so a
 * legacy-stream copy starts after the kernels queued before it and kernels queued after it wait
 * for it.  cudaMemcpy from device to pageable host memory returns only when it is complete, and
 * in stream order after everything issued before it; host to device and device to device
 * copies may return before they land.  So every "wait" below is a download of the stamp (8
 * bytes): when it returns, every copy issued before it has landed.  The fill also waits for
 * MK_STREAM itself (sync) before its copy: the legacy stream's ordering implies it, but the
 * explicit wait keeps the fill right should the copies move to a stream of their own.  The
 * reader's copy into its parameters is ordered with its own kernels (decoding) as
 * mk_model_write_params's upload is: after those queued before, before those queued after.
 */
#include <stdlib.h>
#include <string.h>

#include "mk_internal.h"

struct mk_share {
    const mk_backend *be;
    mk__share_stamp *base; /* the allocation: the stamp, then n floats */
    size_t n;
    unsigned char handle[MK_SHARE_HANDLE_BYTES];
};

_Static_assert(sizeof(mk__share_stamp) == 64, "the stamp keeps the floats 64-byte aligned");

void (*mk__share_test_after_copy)(const mk_backend *be, void *stamp);

static float *share_floats(void *base)
{
    return (float *)((unsigned char *)base + sizeof(mk__share_stamp));
}

/* the stamp's version, read by a copy that returns when it and everything before it is done */
static int64_t stamp_read(const mk_backend *be, const void *base)
{
    int64_t v;
    be->download(&v, base, sizeof v);
    return v;
}

/* stamps version and waits until it has landed */
static void stamp_write(const mk_backend *be, void *base, int64_t version)
{
    be->upload(base, &version, sizeof version);
    (void)stamp_read(be, base);
}

int mk_share_new(mk_model *m, size_t n, mk_share **out)
{
    if (!out) return mk__fail(MK_ERR_ARG, "mk_share_new: out is NULL");
    *out = NULL;
    if (!m) return mk__fail(MK_ERR_ARG, "mk_share_new: model is NULL");
    const mk_backend *be = m->be;
    if (!be->ipc_export || !be->ipc_open || !be->ipc_close)
        return mk__fail(MK_ERR_UNSUPPORTED,
                        "mk_share_new: the %s back-end cannot share memory with other processes "
                        "(CUDA only)",
                        be->name);
    if (n > (SIZE_MAX - sizeof(mk__share_stamp)) / sizeof(float) || (uint64_t)n > INT64_MAX)
        return mk__fail(MK_ERR_ARG, "mk_share_new: %zu floats is too many", n);
    mk_share *s = calloc(1, sizeof *s);
    if (!s) return mk__fail(MK_ERR_NOMEM, "mk_share_new: cannot allocate the share");
    s->be = be;
    s->n = n;
    int rc = be->alloc((void **)&s->base, sizeof(mk__share_stamp) + n * sizeof(float));
    if (rc) {
        free(s);
        return rc;
    }
    mk__share_stamp st;
    memset(&st, 0, sizeof st);
    st.version = -1;
    st.n = (int64_t)n;
    be->upload(s->base, &st, sizeof st);
    (void)stamp_read(be, s->base);
    if ((rc = be->ipc_export(s->handle, s->base))) {
        be->release(s->base);
        free(s);
        return rc;
    }
    *out = s;
    return MK_OK;
}

void mk_share_free(mk_share *s)
{
    if (!s) return;
    s->be->release(s->base);
    free(s);
}

int mk_share_fill(mk_share *s, mk_model *m, size_t off, size_t n, int64_t version)
{
    if (!s || !m) return mk__fail(MK_ERR_ARG, "mk_share_fill: NULL argument");
    if (m->be != s->be)
        return mk__fail(MK_ERR_ARG,
                        "mk_share_fill: the model is on the %s back-end, the share "
                        "on %s",
                        m->be->name, s->be->name);
    if (version < 0)
        return mk__fail(MK_ERR_ARG, "mk_share_fill: version %lld: need >= 0", (long long)version);
    if (n > s->n)
        return mk__fail(MK_ERR_ARG, "mk_share_fill: %zu floats into a share of %zu", n, s->n);
    if (off > m->n_params || n > m->n_params - off)
        return mk__fail(MK_ERR_ARG, "mk_share_fill: range [%zu, %zu) outside %zu parameters", off,
                        off + n, m->n_params);
    const mk_backend *be = s->be;
    stamp_write(be, s->base, -1); /* readers from now on see "being written" */
    if (be->sync) be->sync();     /* the kernels that may be writing m's parameters */
    be->copy(share_floats(s->base), m->params + off, n * sizeof(float));
    (void)stamp_read(be, s->base); /* the copy has landed */
    stamp_write(be, s->base, version);
    return MK_OK;
}

void mk_share_handle(const mk_share *s, unsigned char out[MK_SHARE_HANDLE_BYTES])
{
    memcpy(out, s->handle, MK_SHARE_HANDLE_BYTES);
}

/* the mapping of the share named by handle: from m's cache (moved to the front), else opened
 * and put in front, closing the least recent when the cache is full */
static int shared_open(mk_model *m, const unsigned char *handle, void **base)
{
    int i = 0;
    while (i < m->n_shared && memcmp(m->shared[i].handle, handle, MK_SHARE_HANDLE_BYTES)) i++;
    if (i < m->n_shared) {
        *base = m->shared[i].base;
    } else {
        int rc = m->be->ipc_open(base, handle);
        if (rc) return rc;
        if (m->n_shared == MK__SHARED_OPEN) m->be->ipc_close(m->shared[--m->n_shared].base);
        i = m->n_shared++;
        memcpy(m->shared[i].handle, handle, MK_SHARE_HANDLE_BYTES);
        m->shared[i].base = *base;
    }
    mk__shared_map e = m->shared[i]; /* to the front */
    memmove(&m->shared[1], &m->shared[0], (size_t)i * sizeof e);
    m->shared[0] = e;
    return MK_OK;
}

void mk__shared_close_all(mk_model *m)
{
    for (int i = 0; i < m->n_shared; i++) m->be->ipc_close(m->shared[i].base);
    m->n_shared = 0;
}

/* The share named by handle, opened, holding version and floats [src_off, src_off + n):
 * MK_OK with its mapping in *base, or the error (what names the caller). */
static int share_ready(mk_model *m, const char *what, const unsigned char *handle, size_t src_off,
                       size_t n, int64_t version, void **base)
{
    if (!m || !handle) return mk__fail(MK_ERR_ARG, "%s: NULL argument", what);
    const mk_backend *be = m->be;
    if (!be->ipc_export || !be->ipc_open || !be->ipc_close)
        return mk__fail(MK_ERR_UNSUPPORTED,
                        "%s: the %s back-end cannot open memory of other processes (CUDA only)",
                        what, be->name);
    if (version < 0)
        return mk__fail(MK_ERR_ARG, "%s: version %lld: need >= 0", what, (long long)version);
    int rc = shared_open(m, handle, base);
    if (rc) return rc;
    mk__share_stamp st;
    be->download(&st, *base, 2 * sizeof(int64_t));
    if (st.n < 0 || src_off > (uint64_t)st.n || n > (uint64_t)st.n - src_off)
        return mk__fail(MK_ERR_ARG, "%s: floats [%zu, %zu) of a share of %lld", what, src_off,
                        src_off + n, (long long)st.n);
    if (st.version != version)
        return mk__fail(MK_ERR_STATE,
                        "%s: the share holds %s%lld, not version %lld (nothing written)", what,
                        st.version < 0 ? "no version (being written): " : "version ",
                        (long long)st.version, (long long)version);
    return MK_OK;
}

int mk_model_share_check(mk_model *m, const unsigned char handle[MK_SHARE_HANDLE_BYTES],
                         size_t src_off, size_t n, int64_t version)
{
    void *base;
    return share_ready(m, "mk_model_share_check", handle, src_off, n, version, &base);
}

int mk_model_write_params_shared(mk_model *m, const unsigned char handle[MK_SHARE_HANDLE_BYTES],
                                 size_t src_off, size_t off, size_t n, int64_t version)
{
    const char *what = "mk_model_write_params_shared";
    void *base;
    int rc = share_ready(m, what, handle, src_off, n, version, &base);
    if (rc) return rc;
    if (off > m->n_params || n > m->n_params - off)
        return mk__fail(MK_ERR_ARG, "%s: range [%zu, %zu) outside %zu parameters", what, off,
                        off + n, m->n_params);
    const mk_backend *be = m->be;
    be->copy(m->params + off, share_floats(base) + src_off, n * sizeof(float));
    mk__params_changed(m);
    if (mk__share_test_after_copy) mk__share_test_after_copy(be, base);
    int64_t after = stamp_read(be, base); /* returns once the copy is done */
    if (after != version)
        return mk__fail(MK_ERR_STATE,
                        "mk_model_write_params_shared: the share went from version %lld to %lld "
                        "during the copy: parameters [%zu, %zu) may mix two versions; write them "
                        "again",
                        (long long)version, (long long)after, off, off + n);
    return MK_OK;
}
