/*
 * logs.c -- `manta logs`: an actor's log lines made readable.
 *
 * Actors and node agents write one JSON object a line (runtime/core/log.c);
 * whatever else lands in the file (a child process's output, a class's own
 * printf) is not JSON and passes through untouched.
 */
#include "cli_internal.h"

#include <cjson/cJSON.h>
#include <string.h>

static const char *str(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

void cli_log_line(const char *line, int raw, int color, FILE *out)
{
    cJSON *j = raw || line[0] != '{' ? NULL : cJSON_Parse(line);
    const cJSON *msg = j ? cJSON_GetObjectItemCaseSensitive(j, "msg") : NULL;
    if (!cJSON_IsString(msg)) {
        fprintf(out, "%s\n", line);
        cJSON_Delete(j);
        return;
    }
    const char *time = str(j, "time"), *level = str(j, "level");
    const char *t = strchr(time, 'T'); /* the clock of the ISO time: HH:MM:SS.mmm */
    const cJSON *inc = cJSON_GetObjectItemCaseSensitive(j, "incarnation");
    char who[160];
    snprintf(who, sizeof who, "%s#%d", str(j, "actor"), cJSON_IsNumber(inc) ? inc->valueint : 0);
    const char *on = "", *off = "";
    if (color) {
        off = "\033[0m";
        on = !strcmp(level, "error")   ? "\033[31m"
             : !strcmp(level, "warn")  ? "\033[33m"
             : !strcmp(level, "debug") ? "\033[2m"
                                       : "";
    }
    char lv[8];
    snprintf(lv, sizeof lv, "%s", level);
    for (char *p = lv; *p; p++) *p = (char)(*p >= 'a' && *p <= 'z' ? *p - 32 : *p);
    fprintf(out, "%.12s %s%-5s%s %-16s %s\n", t ? t + 1 : time, on, lv, color ? off : "", who,
            msg->valuestring);
    cJSON_Delete(j);
}
