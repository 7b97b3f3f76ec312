/* floor_stat [-u] [-v] SRC DST [THREADS]
 *
 * The syscall floor of a no-op re-sync: walk SRC and DST side by side, and for
 * each directory pair: openat + getdents64 on both sides, sort both name lists,
 * merge-join them, statx(dirfd, name, AT_SYMLINK_NOFOLLOW) each common entry on
 * both sides (readlinkat both for symlinks) and compare. Nothing is written.
 * The entry pairs of one directory are split in batches of 256 that THREADS
 * threads (default 1) take from one queue.
 *
 * Prints `entries=N missing=N extra=N differ=N modediff=N dirmeta=N updated=N`:
 *   missing  entries of SRC absent from DST        extra    entries of DST absent from SRC
 *   differ   files whose type, size or mtime (ns) differs, symlinks whose target differs
 *   modediff files/dirs whose permission bits differ
 *   dirmeta  directories whose mtime differs
 * so the bench driver also uses it to check that a tool made a correct copy.
 *
 * -u  also brings differing and missing regular files up to date, the way a sync
 *     tool must: copy to DST/.floor-tmp.NAME (O_CREAT|O_EXCL, copy_file_range),
 *     futimens, renameat over NAME; then the mtime of each directory written to is
 *     set back to that of SRC. That is the floor of a re-sync after some files
 *     changed. (Missing directories and symlinks are only counted.)
 * -v  prints each difference on stderr.
 */
#include "floor_common.h"

struct dref {
    int fd, dfd;
    char *path;
    struct names s, d;
    size_t *ps, *pd; /* common entries: indices into s and d */
    size_t np;
    int64_t mtime; /* SRC mtime of this directory */
    atomic_int written;
    atomic_int refs;
};

enum { J_DIR, J_BATCH };

static int g_update, g_verbose;
static atomic_long c_entries, c_missing, c_extra, c_differ, c_mode, c_dirmeta, c_updated;
static const char *g_src, *g_dst;
static pthread_mutex_t w_mu = PTHREAD_MUTEX_INITIALIZER;
static char **g_wpath;
static int64_t *g_wmtime;
static size_t g_wn, g_wcap;

static void note(const char *what, const char *dir, const char *name) {
    if (g_verbose) fprintf(stderr, "%s %s%s%s\n", what, dir, *dir ? "/" : "", name);
}

static void unref(struct dref *d) {
    if (atomic_fetch_sub(&d->refs, 1) == 1) {
        if (atomic_load(&d->written)) {
            pthread_mutex_lock(&w_mu);
            if (g_wn == g_wcap) {
                g_wcap = g_wcap ? g_wcap * 2 : 64;
                g_wpath = xrealloc(g_wpath, g_wcap * sizeof *g_wpath);
                g_wmtime = xrealloc(g_wmtime, g_wcap * sizeof *g_wmtime);
            }
            g_wpath[g_wn] = strdup(*d->path ? d->path : ".");
            g_wmtime[g_wn++] = d->mtime;
            pthread_mutex_unlock(&w_mu);
        }
        close(d->fd);
        close(d->dfd);
        names_free(&d->s);
        names_free(&d->d);
        free(d->ps);
        free(d->pd);
        free(d->path);
        free(d);
    }
}

static int cmp_names(const void *a, const void *b, void *arg) {
    const struct names *nm = arg;
    return strcmp(NAME(nm, *(const size_t *)a), NAME(nm, *(const size_t *)b));
}

static size_t *sorted_index(struct names *nm) {
    size_t *ix = xmalloc(nm->n * sizeof *ix);
    for (size_t i = 0; i < nm->n; i++) ix[i] = i;
    qsort_r(ix, nm->n, sizeof *ix, cmp_names, nm);
    return ix;
}

static void update_file(struct dref *d, const char *name, struct statx *st) {
    char tmp[300];
    snprintf(tmp, sizeof tmp, ".floor-tmp.%.255s", name);
    int in = openat(d->fd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (in < 0) die("open %s", name);
    int out = openat(d->dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, st->stx_mode & 07777);
    if (out < 0) die("create %s", tmp);
    if (st->stx_size) copy_data(in, out, st->stx_size, name);
    struct timespec ts[2] = {{0, UTIME_OMIT}, {st->stx_mtime.tv_sec, st->stx_mtime.tv_nsec}};
    if (futimens(out, ts) < 0) die("futimens %s", tmp);
    close(in);
    close(out);
    if (renameat(d->dfd, tmp, d->dfd, name) < 0) die("rename %s", tmp);
    atomic_store(&d->written, 1);
    atomic_fetch_add(&c_updated, 1);
}

static void compare_batch(struct dref *d, size_t lo, size_t hi) {
    for (size_t i = lo; i < hi; i++) {
        const char *name = NAME(&d->s, d->ps[i]);
        struct statx a, b;
        if (statx(d->fd, name, STATX_FLAGS, STATX_WANT, &a) < 0) die("statx src %s", name);
        if (statx(d->dfd, name, STATX_FLAGS, STATX_WANT, &b) < 0) die("statx dst %s", name);
        int ta = a.stx_mode & S_IFMT, tb = b.stx_mode & S_IFMT;
        if (ta != tb) {
            atomic_fetch_add(&c_differ, 1);
            note("type", d->path, name);
            continue;
        }
        if ((a.stx_mode & 07777) != (b.stx_mode & 07777) && !S_ISLNK(a.stx_mode)) {
            atomic_fetch_add(&c_mode, 1);
            note("mode", d->path, name);
        }
        if (S_ISREG(a.stx_mode)) {
            if (a.stx_size != b.stx_size || ts_ns(a.stx_mtime) != ts_ns(b.stx_mtime)) {
                atomic_fetch_add(&c_differ, 1);
                note("differ", d->path, name);
                if (g_update) update_file(d, name, &a);
            }
        } else if (S_ISLNK(a.stx_mode)) {
            char x[4096], y[4096];
            ssize_t nx = readlinkat(d->fd, name, x, sizeof x);
            ssize_t ny = readlinkat(d->dfd, name, y, sizeof y);
            if (nx < 0 || ny < 0) die("readlinkat %s", name);
            if (nx != ny || memcmp(x, y, (size_t)nx)) {
                atomic_fetch_add(&c_differ, 1);
                note("target", d->path, name);
            }
        } else if (S_ISDIR(a.stx_mode)) {
            if (ts_ns(a.stx_mtime) != ts_ns(b.stx_mtime)) {
                atomic_fetch_add(&c_dirmeta, 1);
                note("dirmtime", d->path, name);
            }
            atomic_fetch_add(&d->refs, 1);
            q_push(J_DIR, d, NULL, 0, (size_t)ts_ns(a.stx_mtime), (char *)name);
        }
    }
}

static void run_job(struct job *j) {
    if (j->kind == J_BATCH) {
        compare_batch(j->a, j->lo, j->hi);
        unref(j->a);
        return;
    }
    struct dref *parent = j->a;
    struct dref *d = xmalloc(sizeof *d);
    memset(d, 0, sizeof *d);
    d->mtime = (int64_t)j->hi;
    if (parent) {
        d->path = join_path(parent->path, j->name);
        d->fd = openat(parent->fd, j->name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        d->dfd = openat(parent->dfd, j->name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        unref(parent);
    } else {
        d->path = strdup("");
        d->fd = open(g_src, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        d->dfd = open(g_dst, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    }
    if (d->fd < 0 || d->dfd < 0) die("open dir %s", d->path);
    atomic_init(&d->refs, 1);
    read_names(d->fd, &d->s, d->path);
    read_names(d->dfd, &d->d, d->path);
    atomic_fetch_add(&c_entries, (long)d->s.n);
    size_t *is = sorted_index(&d->s), *id = sorted_index(&d->d);
    d->ps = xmalloc(d->s.n * sizeof *d->ps);
    d->pd = xmalloc(d->s.n * sizeof *d->pd);
    size_t i = 0, k = 0;
    while (i < d->s.n || k < d->d.n) {
        int c = i == d->s.n ? 1 : k == d->d.n ? -1 : strcmp(NAME(&d->s, is[i]), NAME(&d->d, id[k]));
        if (c == 0) {
            d->ps[d->np] = is[i++];
            d->pd[d->np++] = id[k++];
        } else if (c < 0) {
            const char *name = NAME(&d->s, is[i++]);
            atomic_fetch_add(&c_missing, 1);
            note("missing", d->path, name);
            if (g_update) {
                struct statx st;
                if (statx(d->fd, name, STATX_FLAGS, STATX_WANT, &st) < 0) die("statx %s", name);
                if (S_ISREG(st.stx_mode)) update_file(d, name, &st);
            }
        } else {
            atomic_fetch_add(&c_extra, 1);
            note("extra", d->path, NAME(&d->d, id[k]));
            k++;
        }
    }
    free(is);
    free(id);
    size_t n = d->np, first = n < BATCH ? n : BATCH;
    for (size_t lo = first; lo < n; lo += BATCH) {
        atomic_fetch_add(&d->refs, 1);
        q_push(J_BATCH, d, NULL, lo, lo + BATCH < n ? lo + BATCH : n, NULL);
    }
    compare_batch(d, 0, first);
    unref(d);
}

int main(int argc, char **argv) {
    int ai = 1;
    for (; ai < argc && argv[ai][0] == '-'; ai++) {
        if (strcmp(argv[ai], "-u") == 0)
            g_update = 1;
        else if (strcmp(argv[ai], "-v") == 0)
            g_verbose = 1;
        else
            break;
    }
    if (argc - ai < 2 || argc - ai > 3) {
        fprintf(stderr, "usage: floor_stat [-u] [-v] SRC DST [THREADS]\n");
        return 2;
    }
    g_src = argv[ai];
    g_dst = argv[ai + 1];
    int threads = argc - ai == 3 ? parse_threads(argv[ai + 2]) : 1;
    umask(0);
    raise_nofile();
    struct statx a, b;
    if (statx(AT_FDCWD, g_src, 0, STATX_WANT, &a) < 0) die("statx %s", g_src);
    if (statx(AT_FDCWD, g_dst, 0, STATX_WANT, &b) < 0) die("statx %s", g_dst);
    if (ts_ns(a.stx_mtime) != ts_ns(b.stx_mtime)) {
        c_dirmeta++;
        note("dirmtime", "", ".");
    }
    if ((a.stx_mode & 07777) != (b.stx_mode & 07777)) {
        c_mode++;
        note("mode", "", ".");
    }
    g_run_job = run_job;
    q_push(J_DIR, NULL, NULL, 0, (size_t)ts_ns(a.stx_mtime), NULL);
    run_workers(threads);
    if (g_wn) {
        int root = open(g_dst, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (root < 0) die("open %s", g_dst);
        for (size_t i = 0; i < g_wn; i++) {
            struct timespec ts[2] = {{0, UTIME_OMIT},
                                     {g_wmtime[i] / 1000000000LL, g_wmtime[i] % 1000000000LL}};
            if (utimensat(root, g_wpath[i], ts, AT_SYMLINK_NOFOLLOW) < 0) die("utimensat %s", g_wpath[i]);
        }
    }
    printf("entries=%ld missing=%ld extra=%ld differ=%ld modediff=%ld dirmeta=%ld updated=%ld\n",
           atomic_load(&c_entries), atomic_load(&c_missing), atomic_load(&c_extra),
           atomic_load(&c_differ), atomic_load(&c_mode), atomic_load(&c_dirmeta),
           atomic_load(&c_updated));
    return 0;
}
