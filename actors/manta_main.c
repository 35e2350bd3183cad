/*
 * manta_main.c -- the `manta` executable: the runtime's CLI with the RL
 * actor classes of this folder as its built-in classes, the spec keys
 * they read (rl_keys.c) declared to the spec loader, and the defaults they
 * derive (rl_defaults.c: a GPU share per policy group with model.device cuda).
 */
#include "manta_actors.h"
#include "rl_util.h"

#include <manta_cli.h>

int main(int argc, char **argv)
{
    const manta_cli_builtins b = {manta_builtin_classes, rl_spec_sections, rl_settings_keys,
                                  rl_spec_defaults};
    return manta_cli_run(argc, argv, &b);
}
