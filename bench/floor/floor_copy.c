/* floor_copy SRC DST [THREADS]
 *
 * The syscall floor of copying a tree into a new directory (like `cp -a SRC DST`
 * for a DST that does not exist yet):
 *   per directory: openat(O_DIRECTORY) + getdents64 on SRC, mkdirat + openat on DST;
 *   per entry:     statx(dirfd, name, AT_SYMLINK_NOFOLLOW);
 *   per file:      openat src, openat dst O_CREAT|O_EXCL (mode from src), copy_file_range
 *                  (read/write where unsupported; none for empty files), futimens, 2x close;
 *   per symlink:   readlinkat + symlinkat + utimensat(AT_SYMLINK_NOFOLLOW);
 *   at the end:    utimensat per directory (deepest first) so directory mtimes match.
 * The entries of one directory are split in batches of 256 that THREADS threads
 * (default 1) take from one queue. No fsync, no temp names, no owner change
 * (run as the owner of SRC). Other file types are skipped.
 */
#include "floor_common.h"

struct dref {
    int fd, dfd;
    char *path;
    struct names nm;
    atomic_int refs;
};

struct dmeta {
    char *path;
    int64_t mtime;
    mode_t mode;
    int depth;
};

enum { J_DIR, J_BATCH };

static atomic_long g_files, g_bytes;
static pthread_mutex_t dm_mu = PTHREAD_MUTEX_INITIALIZER;
static struct dmeta *g_dm;
static size_t g_dmn, g_dmcap;
static const char *g_src, *g_dst;

static void unref(struct dref *d) {
    if (atomic_fetch_sub(&d->refs, 1) == 1) {
        close(d->fd);
        close(d->dfd);
        names_free(&d->nm);
        free(d->path);
        free(d);
    }
}

static void add_dmeta(const char *path, int64_t mtime, mode_t mode) {
    int depth = 0;
    for (const char *p = path; *p; p++) depth += *p == '/';
    if (*path) depth++;
    pthread_mutex_lock(&dm_mu);
    if (g_dmn == g_dmcap) {
        g_dmcap = g_dmcap ? g_dmcap * 2 : 256;
        g_dm = xrealloc(g_dm, g_dmcap * sizeof *g_dm);
    }
    g_dm[g_dmn++] = (struct dmeta){strdup(path), mtime, mode, depth};
    pthread_mutex_unlock(&dm_mu);
}

static void copy_batch(struct dref *d, size_t lo, size_t hi) {
    long files = 0, bytes = 0;
    for (size_t i = lo; i < hi; i++) {
        const char *name = NAME(&d->nm, i);
        struct statx st;
        if (statx(d->fd, name, STATX_FLAGS, STATX_WANT, &st) < 0) die("statx %s/%s", d->path, name);
        mode_t m = st.stx_mode;
        struct timespec ts[2] = {{0, UTIME_OMIT}, {st.stx_mtime.tv_sec, st.stx_mtime.tv_nsec}};
        if (S_ISREG(m)) {
            int in = openat(d->fd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
            if (in < 0) die("open %s/%s", d->path, name);
            int out = openat(d->dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, m & 07777);
            if (out < 0) die("create %s/%s", d->path, name);
            if (st.stx_size) copy_data(in, out, st.stx_size, name);
            if (futimens(out, ts) < 0) die("futimens %s", name);
            close(in);
            close(out);
            files++;
            bytes += (long)st.stx_size;
        } else if (S_ISDIR(m)) {
            atomic_fetch_add(&d->refs, 1);
            q_push(J_DIR, d, NULL, m, (size_t)ts_ns(st.stx_mtime), (char *)name);
        } else if (S_ISLNK(m)) {
            char tgt[4096];
            ssize_t n = readlinkat(d->fd, name, tgt, sizeof tgt - 1);
            if (n < 0) die("readlinkat %s", name);
            tgt[n] = 0;
            if (symlinkat(tgt, d->dfd, name) < 0) die("symlinkat %s", name);
            if (utimensat(d->dfd, name, ts, AT_SYMLINK_NOFOLLOW) < 0) die("utimensat %s", name);
        }
    }
    atomic_fetch_add(&g_files, files);
    atomic_fetch_add(&g_bytes, bytes);
}

static void run_job(struct job *j) {
    if (j->kind == J_BATCH) {
        copy_batch(j->a, j->lo, j->hi);
        unref(j->a);
        return;
    }
    struct dref *parent = j->a;
    struct dref *d = xmalloc(sizeof *d);
    memset(d, 0, sizeof *d);
    mode_t mode = (mode_t)j->lo;
    int64_t mtime = (int64_t)j->hi;
    if (parent) {
        d->path = join_path(parent->path, j->name);
        d->fd = openat(parent->fd, j->name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (d->fd < 0) die("open dir %s", d->path);
        if (mkdirat(parent->dfd, j->name, (mode & 07777) | S_IRWXU) < 0) die("mkdir %s", d->path);
        d->dfd = openat(parent->dfd, j->name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (d->dfd < 0) die("open dst dir %s", d->path);
        unref(parent);
    } else {
        d->path = strdup("");
        d->fd = open(g_src, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (d->fd < 0) die("open %s", g_src);
        if (mkdir(g_dst, (mode & 07777) | S_IRWXU) < 0 && errno != EEXIST) die("mkdir %s", g_dst);
        d->dfd = open(g_dst, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (d->dfd < 0) die("open %s", g_dst);
    }
    add_dmeta(d->path, mtime, mode);
    atomic_init(&d->refs, 1);
    read_names(d->fd, &d->nm, d->path);
    size_t n = d->nm.n, first = n < BATCH ? n : BATCH;
    for (size_t lo = first; lo < n; lo += BATCH) {
        atomic_fetch_add(&d->refs, 1);
        q_push(J_BATCH, d, NULL, lo, lo + BATCH < n ? lo + BATCH : n, NULL);
    }
    copy_batch(d, 0, first);
    unref(d);
}

static int by_depth_desc(const void *a, const void *b) {
    return ((const struct dmeta *)b)->depth - ((const struct dmeta *)a)->depth;
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: floor_copy SRC DST [THREADS]\n");
        return 2;
    }
    g_src = argv[1];
    g_dst = argv[2];
    int threads = argc == 4 ? parse_threads(argv[3]) : 1;
    umask(0);
    raise_nofile();
    struct statx st;
    if (statx(AT_FDCWD, g_src, 0, STATX_WANT, &st) < 0) die("statx %s", g_src);
    g_run_job = run_job;
    q_push(J_DIR, NULL, NULL, st.stx_mode, (size_t)ts_ns(st.stx_mtime), NULL);
    run_workers(threads);
    int root = open(g_dst, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (root < 0) die("open %s", g_dst);
    qsort(g_dm, g_dmn, sizeof *g_dm, by_depth_desc);
    for (size_t i = 0; i < g_dmn; i++) {
        const char *p = *g_dm[i].path ? g_dm[i].path : ".";
        if ((g_dm[i].mode & S_IRWXU) != S_IRWXU && fchmodat(root, p, g_dm[i].mode & 07777, 0) < 0)
            die("chmod %s", p);
        struct timespec ts[2] = {{0, UTIME_OMIT},
                                 {g_dm[i].mtime / 1000000000LL, g_dm[i].mtime % 1000000000LL}};
        if (utimensat(root, p, ts, AT_SYMLINK_NOFOLLOW) < 0) die("utimensat %s", p);
    }
    printf("files=%ld bytes=%ld dirs=%zu\n", atomic_load(&g_files), atomic_load(&g_bytes), g_dmn);
    return 0;
}
