/* floor_big SRC DST
 *
 * The syscall floor of copying one (big) file: open SRC, fstat, open DST
 * O_CREAT|O_EXCL, copy_file_range in a loop (each call as large as the kernel
 * takes; read/write with a 1 MiB buffer where unsupported), futimens, close.
 */
#include "floor_common.h"

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: floor_big SRC DST\n");
        return 2;
    }
    int in = open(argv[1], O_RDONLY | O_CLOEXEC);
    if (in < 0) die("open %s", argv[1]);
    struct stat st;
    if (fstat(in, &st) < 0) die("fstat %s", argv[1]);
    umask(0);
    int out = open(argv[2], O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, st.st_mode & 07777);
    if (out < 0) die("create %s", argv[2]);
    copy_data(in, out, (uint64_t)st.st_size, argv[1]);
    struct timespec ts[2] = {{0, UTIME_OMIT}, st.st_mtim};
    if (futimens(out, ts) < 0) die("futimens %s", argv[2]);
    if (close(out) < 0) die("close %s", argv[2]);
    close(in);
    printf("bytes=%lld\n", (long long)st.st_size);
    return 0;
}
