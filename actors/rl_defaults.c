/*
 * rl_defaults.c - what the RL classes derive for a spec where it says
 * nothing (manta_spec_options.defaults; `manta run` and `manta scale` load
 * every spec with it).
 *
 * One default today: the GPU share of the groups that run the policy model.
 * With model.device cuda (or a group's settings.device / settings.model.device,
 * read with the precedence of rl_args), a group of a built-in class that
 * opens the model (learner, rollout) and without a resources.gpu of its own
 * gets a share of one device: the replicas of all such groups, counted as
 * the spec starts them, share one GPU. The share is 1/N rounded down to a
 * thousandth (N = those replicas; at least 0.001, and 1 when N <= 1), so
 * that N of them always fit on one device. A value in the spec or a --set,
 * 0 included, wins; on the CPU (the default) nothing is derived.
 */
#include "rl_util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The built-in classes whose actors open the policy model (rl_model_open). */
static const char *const POLICY_CLASSES[] = {"learner", "rollout", NULL};

static bool is_policy_class(const char *c)
{
    for (size_t i = 0; POLICY_CLASSES[i]; i++)
        if (!strcmp(c, POLICY_CLASSES[i])) return true;
    return false;
}

/* A node with a value: present and not null. */
static bool given(const manta_spec_node *n)
{
    return n && manta_spec_scalar_type(n) != MANTA_SPEC_T_NULL;
}

/* The device group g's actors read: settings.model.device, settings.device,
 * then model.device (rl_args' lookup), "cpu" when none is a string. */
static const char *group_device(const manta_spec_node *root, const manta_spec_node *g)
{
    const char *dev;
    if (manta_spec_get_str(g, "settings.model.device", NULL, &dev, NULL) == 0) return dev;
    if (manta_spec_get_str(g, "settings.device", NULL, &dev, NULL) == 0) return dev;
    if (manta_spec_get_str(root, "model.device", NULL, &dev, NULL) == 0) return dev;
    return "cpu";
}

double rl_gpu_share(int64_t replicas)
{
    if (replicas <= 1) return 1;
    int64_t k = 1000 / replicas;
    return (double)(k > 0 ? k : 1) / 1000;
}

int rl_spec_defaults(manta_spec_defaults *d, const manta_spec_node *root, void *user)
{
    (void)user;
    const manta_spec_node *groups = manta_spec_find(root, "groups");
    size_t n = groups && groups->kind == MANTA_SPEC_MAP ? manta_spec_len(groups) : 0;
    if (n == 0) return 0;
    size_t *want = malloc(n * sizeof *want);
    if (!want) return MANTA_ENOMEM;
    size_t nw = 0;
    int64_t replicas = 0;
    char names[256] = "";
    size_t used = 0;
    for (size_t i = 0; i < n; i++) {
        const manta_spec_node *g = manta_spec_at(groups, i);
        const char *cls;
        const char *name = manta_spec_key_at(groups, i);
        if (!g || g->kind != MANTA_SPEC_MAP || strchr(name, '.') ||
            strlen(name) > MANTA_SPEC_MAX_NAME ||
            manta_spec_get_str(g, "class", NULL, &cls, NULL) != 0 || !is_policy_class(cls) ||
            given(manta_spec_find(g, "library")) || strcmp(group_device(root, g), "cuda") != 0 ||
            given(manta_spec_find(g, "resources.gpu")))
            continue;
        int64_t r = 1;
        if (manta_spec_get_int(g, "replicas", 1, &r, NULL) != 0 || r < 0) r = r < 0 ? 0 : 1;
        replicas += r;
        want[nw++] = i;
        int w = snprintf(names + used, sizeof names - used, "%s%s", used ? ", " : "", name);
        used = w < 0 || (size_t)w >= sizeof names - used ? sizeof names - 1 : used + (size_t)w;
    }
    int rc = 0;
    if (nw) {
        char value[32], why[400], path[128];
        snprintf(value, sizeof value, "%g", rl_gpu_share(replicas));
        snprintf(why, sizeof why, "model.device is cuda: the %lld replica%s of %s %s one GPU",
                 (long long)replicas, replicas == 1 ? "" : "s", names,
                 replicas == 1 ? "has" : "share");
        for (size_t k = 0; k < nw && rc >= 0; k++) {
            snprintf(path, sizeof path, "groups.%s.resources.gpu",
                     manta_spec_key_at(groups, want[k]));
            rc = manta_spec_default(d, path, value, why);
        }
    }
    free(want);
    return rc < 0 ? rc : 0;
}
