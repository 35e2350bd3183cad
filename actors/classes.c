/*
 * classes.c - the list of built-in RL actor classes that `manta run` and
 * every RL driver hand to manta_init().
 */
#include "manta_actors.h"

const manta_class *const manta_builtin_classes[] = {
    &rl_controller_class, &rl_rollout_class, &rl_env_class,
    &rl_reward_class,     &rl_learner_class, NULL,
};
