# Install rules and pkg-config files, so another program can link Manta:
#
#   cmake --install build --prefix /usr/local
#   cc app.c $(pkg-config --cflags --libs manta)          # the actor core
#   cc app.c $(pkg-config --cflags --libs manta-job)      # + jobs from specs
#
# Libraries are static archives; each .pc file names the Debian packages its
# library needs in Requires, so `pkg-config --libs` gives a complete link line.
include(GNUInstallDirs)

set(MANTA_PC_DIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
set(MANTA_INCLUDE_SUBDIR manta)

# manta_install_lib(TARGET PCNAME DESCRIPTION REQUIRES EXTRA_LIBS HEADERS...)
function(manta_install_lib target pcname description requires extra_libs)
  install(TARGETS ${target} ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(FILES ${ARGN} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/${MANTA_INCLUDE_SUBDIR})
  set(PC_NAME ${pcname})
  set(PC_DESCRIPTION ${description})
  set(PC_REQUIRES ${requires})
  set(PC_LIB ${target})
  set(PC_EXTRA_LIBS ${extra_libs})
  configure_file(${PROJECT_SOURCE_DIR}/cmake/manta.pc.in
                 ${PROJECT_BINARY_DIR}/pkgconfig/${pcname}.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/pkgconfig/${pcname}.pc DESTINATION ${MANTA_PC_DIR})
endfunction()

set(R ${PROJECT_SOURCE_DIR}/runtime)
manta_install_lib(manta manta "Manta actor runtime: actors, calls and futures, registry, objects"
                  "libzmq msgpack hiredis" "-lpthread -lm" ${R}/core/manta.h)
manta_install_lib(manta_http manta-http "Manta HTTP client (libcurl multi on the event loop)"
                  "manta libcurl" "" ${R}/http/manta_http.h)
manta_install_lib(manta_spec manta-spec "Manta spec files (YAML)"
                  "manta yaml-0.1" "" ${R}/spec/manta_spec.h)
manta_install_lib(manta_collective manta-collective "Manta collectives (ZeroMQ back-end)"
                  "manta" "" ${R}/collective/manta_collective.h)
manta_install_lib(manta_job manta-job "Manta jobs: placement, services, failover, scale"
                  "manta-spec" "" ${R}/job/manta_job.h)
manta_install_lib(manta_kernels manta-kernels "Manta policy kernels (CPU, OpenBLAS)"
                  "openblas libcjson" "-fopenmp -lm" ${PROJECT_SOURCE_DIR}/kernels/manta_kernels.h)
manta_install_lib(manta_tok manta-tok "Manta tokenizer: byte-level BPE and chat formats"
                  "libpcre2-8 icu-uc libcjson" "" ${PROJECT_SOURCE_DIR}/tokenizer/manta_tok.h)
install(TARGETS manta_exe RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(MANTA_HAVE_CUDA)
  install(TARGETS manta_cuda LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/manta)
endif()
if(TARGET manta_nccl_module) # libmanta_nccl.so, the NCCL back-end `manta` loads
  install(TARGETS manta_nccl_module LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/manta)
endif()
