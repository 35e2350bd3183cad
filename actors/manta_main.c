/*
 * manta_main.c -- the `manta` executable: the runtime's CLI with the RL
 * actor classes of this folder as its built-in classes.
 */
#include "manta_actors.h"

#include <manta_cli.h>

int main(int argc, char **argv)
{
    return manta_cli_main(argc, argv, manta_builtin_classes);
}
