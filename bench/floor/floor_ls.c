/* floor_ls [-p] DIR [THREADS]
 *
 * The syscall floor of a recursive listing with size and mtime of every entry:
 * openat(O_DIRECTORY) + getdents64 (1 MiB buffer) per directory, then one
 * statx(dirfd, name, AT_SYMLINK_NOFOLLOW) per entry (and readlinkat per symlink
 * with -p). The stat work of one directory is split in batches of 256 entries
 * that all THREADS threads (default 1) take from one queue, so a directory of
 * 500,000 entries is stat'ed in parallel.
 *
 * Prints the number of entries (the root excluded). With -p it prints instead
 * `SIZE MTIME_NS PATH` per entry like `ferry ls` (dirs end with '/', symlinks as
 * `PATH -> TARGET`), buffered and written 1 MiB at a time; the count goes to stderr.
 */
#include "floor_common.h"

struct dref {
    int fd;
    char *path;
    struct names nm;
    atomic_int refs;
};

enum { J_DIR, J_BATCH };

static int g_print;
static atomic_long g_count;

static void unref(struct dref *d) {
    if (atomic_fetch_sub(&d->refs, 1) == 1) {
        close(d->fd);
        names_free(&d->nm);
        free(d->path);
        free(d);
    }
}

static void stat_batch(struct dref *d, size_t lo, size_t hi) {
    for (size_t i = lo; i < hi; i++) {
        const char *name = NAME(&d->nm, i);
        struct statx st;
        if (statx(d->fd, name, STATX_FLAGS, STATX_WANT, &st) < 0) {
            if (errno == ENOENT) continue;
            die("statx %s/%s", d->path, name);
        }
        int isdir = S_ISDIR(st.stx_mode);
        if (g_print) {
            out_i64((int64_t)st.stx_size);
            out_bytes(" ", 1);
            out_i64(ts_ns(st.stx_mtime));
            out_bytes(" ", 1);
            size_t pl = strlen(d->path), nl = strlen(name);
            out_reserve(pl + nl + 2);
            if (pl) {
                out_bytes(d->path, pl);
                out_bytes("/", 1);
            }
            out_bytes(name, nl);
            if (isdir) out_bytes("/", 1);
            if (S_ISLNK(st.stx_mode)) {
                char tgt[4096];
                ssize_t n = readlinkat(d->fd, name, tgt, sizeof tgt);
                if (n < 0) die("readlinkat %s", name);
                out_bytes(" -> ", 4);
                out_bytes(tgt, (size_t)n);
            }
            out_bytes("\n", 1);
        }
        if (isdir) {
            atomic_fetch_add(&d->refs, 1);
            q_push(J_DIR, d, NULL, 0, 0, (char *)name);
        }
    }
    atomic_fetch_add(&g_count, (long)(hi - lo));
}

static void run_job(struct job *j) {
    if (j->kind == J_BATCH) {
        stat_batch(j->a, j->lo, j->hi);
        unref(j->a);
        return;
    }
    struct dref *parent = j->a;
    struct dref *d = xmalloc(sizeof *d);
    memset(d, 0, sizeof *d);
    if (parent) {
        d->fd = openat(parent->fd, j->name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        d->path = join_path(parent->path, j->name);
    } else {
        d->fd = open(j->name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        d->path = strdup("");
    }
    if (d->fd < 0) die("open dir %s", j->name);
    if (parent) unref(parent);
    atomic_init(&d->refs, 1);
    read_names(d->fd, &d->nm, d->path);
    size_t n = d->nm.n, first = n < BATCH ? n : BATCH;
    for (size_t lo = first; lo < n; lo += BATCH) {
        atomic_fetch_add(&d->refs, 1);
        q_push(J_BATCH, d, NULL, lo, lo + BATCH < n ? lo + BATCH : n, NULL);
    }
    stat_batch(d, 0, first);
    unref(d);
}

int main(int argc, char **argv) {
    int ai = 1;
    if (ai < argc && strcmp(argv[ai], "-p") == 0) {
        g_print = 1;
        ai++;
    }
    if (argc - ai < 1 || argc - ai > 2) {
        fprintf(stderr, "usage: floor_ls [-p] DIR [THREADS]\n");
        return 2;
    }
    int threads = argc - ai == 2 ? parse_threads(argv[ai + 1]) : 1;
    raise_nofile();
    g_run_job = run_job;
    g_thread_exit = out_flush;
    q_push(J_DIR, NULL, NULL, 0, 0, argv[ai]);
    run_workers(threads);
    if (g_print)
        fprintf(stderr, "%ld\n", atomic_load(&g_count));
    else
        printf("%ld\n", atomic_load(&g_count));
    return 0;
}
