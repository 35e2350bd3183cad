/*
 * manta_main.c -- the `manta` executable: the runtime's CLI with the RL
 * actor classes of this folder as its built-in classes, and the spec keys
 * they read (rl_keys.c) declared to the spec loader.
 */
#include "manta_actors.h"
#include "rl_util.h"

#include <manta_cli.h>

int main(int argc, char **argv)
{
    const manta_cli_builtins b = {manta_builtin_classes, rl_spec_sections, rl_settings_keys};
    return manta_cli_run(argc, argv, &b);
}
