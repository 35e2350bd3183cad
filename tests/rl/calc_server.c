/*
 * calc_server.c - the calc tool server as a child process (calc_server.h).
 */
#include "calc_server.h"

#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

int rl_start_calc_server(const char *script, const char *extra, int *port)
{
    int fds[2];
    if (pipe(fds)) return -1;
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]), close(fds[1]);
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "exec python3 %s --port 0 %s", script, extra ? extra : "");
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    FILE *f = fdopen(fds[0], "r");
    char line[128] = "";
    *port = 0;
    if (f && fgets(line, sizeof line, f)) sscanf(line, "PORT %d", port);
    if (f) fclose(f);
    if (*port <= 0) {
        rl_stop_process(pid);
        return -1;
    }
    return pid;
}

void rl_stop_process(int pid)
{
    if (pid <= 0) return;
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
}
