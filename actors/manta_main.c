/*
 * manta_main.c -- the `manta` executable: the runtime's CLI with the RL
 * actor classes of this folder as its built-in classes.
 *
 * The list is referenced weakly and the library linked whole, so the CLI
 * builds (with no built-ins) even while the class list is being written.
 */
#include <manta.h>
#include <manta_cli.h>

#include <stddef.h>

extern const manta_class *const manta_builtin_classes[] __attribute__((weak));

int main(int argc, char **argv)
{
    static const manta_class *const none[] = {NULL};
    return manta_cli_main(argc, argv, manta_builtin_classes ? manta_builtin_classes : none);
}
