/* Shared helpers for the floor programs: the least syscall work a tool can do.
 *
 * - a work queue (LIFO, so the walk is depth-first and few directory fds are open)
 *   served by N threads; the main thread is one of them;
 * - directory reading with raw getdents64 into a large per-thread buffer;
 * - a per-thread output buffer flushed with one write(2) per MiB.
 *
 * Built by bench/run.py with `cc -O2 -pthread`.
 */
#ifndef FLOOR_COMMON_H
#define FLOOR_COMMON_H
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define DENTS_BUF (1u << 20) /* getdents64 buffer per thread */
#define OUT_BUF (1u << 20)   /* output buffer per thread */
#define BATCH 256            /* entries of one directory handled as one job */

struct linux_dirent64 {
    uint64_t d_ino;
    int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

__attribute__((unused)) static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("floor: ", stderr);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, ": %s\n", strerror(errno));
    va_end(ap);
    exit(1);
}

__attribute__((unused)) static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) die("out of memory");
    return p;
}

__attribute__((unused)) static void *xrealloc(void *p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (!p) die("out of memory");
    return p;
}

__attribute__((unused)) static void raise_nofile(void) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

/* ---- names of one directory ---- */
struct names {
    char *buf;
    size_t len, cap;
    uint32_t *off;
    unsigned char *type;
    size_t n, ncap;
};

static __thread char *t_dents;

__attribute__((unused)) static void names_add(struct names *nm, const char *name, unsigned char type) {
    size_t l = strlen(name) + 1;
    if (nm->len + l > nm->cap) {
        nm->cap = nm->cap ? nm->cap * 2 : 4096;
        while (nm->len + l > nm->cap) nm->cap *= 2;
        nm->buf = xrealloc(nm->buf, nm->cap);
    }
    if (nm->n == nm->ncap) {
        nm->ncap = nm->ncap ? nm->ncap * 2 : 64;
        nm->off = xrealloc(nm->off, nm->ncap * sizeof *nm->off);
        nm->type = xrealloc(nm->type, nm->ncap);
    }
    memcpy(nm->buf + nm->len, name, l);
    nm->off[nm->n] = (uint32_t)nm->len;
    nm->type[nm->n] = type;
    nm->n++;
    nm->len += l;
}

__attribute__((unused)) static void names_free(struct names *nm) {
    free(nm->buf);
    free(nm->off);
    free(nm->type);
    memset(nm, 0, sizeof *nm);
}

#define NAME(nm, i) ((nm)->buf + (nm)->off[i])

/* Read every entry of the open directory fd (minus . and ..) with getdents64. */
__attribute__((unused)) static void read_names(int fd, struct names *nm, const char *what) {
    if (!t_dents) t_dents = xmalloc(DENTS_BUF);
    for (;;) {
        long r = syscall(SYS_getdents64, fd, t_dents, DENTS_BUF);
        if (r < 0) die("getdents64 %s", what);
        if (r == 0) break;
        for (long p = 0; p < r;) {
            struct linux_dirent64 *e = (struct linux_dirent64 *)(t_dents + p);
            p += e->d_reclen;
            const char *s = e->d_name;
            if (s[0] == '.' && (s[1] == 0 || (s[1] == '.' && s[2] == 0))) continue;
            names_add(nm, s, e->d_type);
        }
    }
}

/* ---- work queue ---- */
struct job {
    struct job *next;
    int kind;
    void *a, *b;
    size_t lo, hi;
    char *name;
};

static pthread_mutex_t q_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t q_cv = PTHREAD_COND_INITIALIZER;
static struct job *q_head;
static long q_active; /* queued + running jobs */

__attribute__((unused)) static void q_push(int kind, void *a, void *b, size_t lo, size_t hi, char *name) {
    struct job *j = xmalloc(sizeof *j);
    j->kind = kind;
    j->a = a;
    j->b = b;
    j->lo = lo;
    j->hi = hi;
    j->name = name;
    pthread_mutex_lock(&q_mu);
    j->next = q_head;
    q_head = j;
    q_active++;
    pthread_cond_signal(&q_cv);
    pthread_mutex_unlock(&q_mu);
}

static struct job *q_pop(void) {
    pthread_mutex_lock(&q_mu);
    while (!q_head && q_active > 0) pthread_cond_wait(&q_cv, &q_mu);
    struct job *j = q_head;
    if (j) q_head = j->next;
    pthread_mutex_unlock(&q_mu);
    return j;
}

__attribute__((unused)) static void q_done(void) {
    pthread_mutex_lock(&q_mu);
    if (--q_active == 0) pthread_cond_broadcast(&q_cv);
    pthread_mutex_unlock(&q_mu);
}

typedef void (*job_fn)(struct job *);
static job_fn g_run_job;
static void (*g_thread_exit)(void);

__attribute__((unused)) static void *worker(void *arg) {
    (void)arg;
    struct job *j;
    while ((j = q_pop())) {
        g_run_job(j);
        free(j);
        q_done();
    }
    if (g_thread_exit) g_thread_exit();
    return NULL;
}

/* Run the queue with `threads` threads (the caller is one of them). */
__attribute__((unused)) static void run_workers(int threads) {
    pthread_t tid[256];
    if (threads < 1) threads = 1;
    if (threads > 256) threads = 256;
    for (int i = 1; i < threads; i++)
        if (pthread_create(&tid[i], NULL, worker, NULL)) die("pthread_create");
    worker(NULL);
    for (int i = 1; i < threads; i++) pthread_join(tid[i], NULL);
}

/* ---- output ---- */
static __thread char *t_out;
static __thread size_t t_outlen;
static pthread_mutex_t out_mu = PTHREAD_MUTEX_INITIALIZER;

__attribute__((unused)) static void out_flush(void) {
    if (!t_outlen) return;
    pthread_mutex_lock(&out_mu);
    size_t o = 0;
    while (o < t_outlen) {
        ssize_t w = write(1, t_out + o, t_outlen - o);
        if (w < 0) {
            if (errno == EINTR) continue;
            die("write stdout");
        }
        o += (size_t)w;
    }
    pthread_mutex_unlock(&out_mu);
    t_outlen = 0;
}

__attribute__((unused)) static void out_reserve(size_t n) {
    if (!t_out) t_out = xmalloc(OUT_BUF);
    if (t_outlen + n > OUT_BUF) out_flush();
    if (n > OUT_BUF) die("line too long");
}

__attribute__((unused)) static void out_bytes(const char *s, size_t n) {
    out_reserve(n);
    memcpy(t_out + t_outlen, s, n);
    t_outlen += n;
}

__attribute__((unused)) static void out_i64(int64_t v) {
    char tmp[24];
    int i = sizeof tmp;
    uint64_t u = v < 0 ? (uint64_t)(-(v + 1)) + 1 : (uint64_t)v;
    do {
        tmp[--i] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0) tmp[--i] = '-';
    out_bytes(tmp + i, sizeof tmp - (size_t)i);
}

__attribute__((unused)) static int parse_threads(const char *s) {
    int t = atoi(s);
    if (t < 1 || t > 256) {
        fprintf(stderr, "floor: bad THREADS %s\n", s);
        exit(2);
    }
    return t;
}

__attribute__((unused)) static char *join_path(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = xmalloc(a + b + 2);
    if (a) {
        memcpy(p, dir, a);
        p[a] = '/';
        memcpy(p + a + 1, name, b + 1);
    } else {
        memcpy(p, name, b + 1);
    }
    return p;
}

__attribute__((unused)) static int64_t ts_ns(struct statx_timestamp t) { return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec; }

#define STATX_WANT (STATX_TYPE | STATX_MODE | STATX_SIZE | STATX_MTIME)
#define STATX_FLAGS (AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT)

/* Copy `size` bytes from in to out (both at their current offsets): copy_file_range
 * in as few calls as the kernel allows, falling back to read/write (1 MiB buffer)
 * where copy_file_range is not supported. Stops early at EOF. */
__attribute__((unused)) static void copy_data(int in, int out, uint64_t size, const char *what) {
    static __thread int no_cfr;
    static __thread char *buf;
    uint64_t off = 0;
    while (off < size && !no_cfr) {
        ssize_t n = copy_file_range(in, NULL, out, NULL, size - off, 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EXDEV || errno == ENOSYS || errno == EOPNOTSUPP || errno == EINVAL) {
                no_cfr = 1;
                break;
            }
            die("copy_file_range %s", what);
        }
        if (n == 0) return;
        off += (uint64_t)n;
    }
    if (off >= size) return;
    if (!buf) buf = xmalloc(1u << 20);
    while (off < size) {
        size_t want = size - off < (1u << 20) ? (size_t)(size - off) : (1u << 20);
        ssize_t n = read(in, buf, want);
        if (n < 0) {
            if (errno == EINTR) continue;
            die("read %s", what);
        }
        if (n == 0) return;
        for (ssize_t o = 0; o < n;) {
            ssize_t w = write(out, buf + o, (size_t)(n - o));
            if (w < 0) {
                if (errno == EINTR) continue;
                die("write %s", what);
            }
            o += w;
        }
        off += (uint64_t)n;
    }
}

#endif
