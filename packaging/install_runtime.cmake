# Runs at install time (cmake --install, cpack), after the variables set by the install(CODE)
# of packaging/CMakeLists.txt. Writes the files whose content or place depends on the final
# CMAKE_INSTALL_PREFIX; file(INSTALL) adds DESTDIR and records each file in the manifest.
set(stage "${CKPTFS_BINARY_DIR}/install-stage")
file(REMOVE_RECURSE "${stage}")
file(MAKE_DIRECTORY "${stage}")
set(prefix "${CMAKE_INSTALL_PREFIX}")
set(bin "${prefix}/${CKPTFS_BINDIR}/ckptfs")

# The Python package: the sources, where its library is (ckptfs/_installed.py), and the
# metadata that importlib.metadata and pip read (version from the one VERSION file).
if(prefix STREQUAL "/usr")
  set(pydir "${prefix}/lib/python3/dist-packages")
else()
  set(pydir "${prefix}/lib/python3.${CKPTFS_PYTHON_MINOR}/dist-packages")
endif()
file(INSTALL "${CKPTFS_SOURCE_DIR}/python/ckptfs" DESTINATION "${pydir}"
     FILES_MATCHING PATTERN "*.py" PATTERN "__pycache__" EXCLUDE)
file(WRITE "${stage}/_installed.py"
     "# Written by ckptfs's install (packaging/install_runtime.cmake).\n"
     "SNAPSHOT_LIBRARY = \"${prefix}/${CKPTFS_LIBDIR}/libckptfs_snapshot.so\"\n")
file(INSTALL "${stage}/_installed.py" DESTINATION "${pydir}/ckptfs")
set(distinfo "${stage}/ckptfs-${CKPTFS_VERSION}.dist-info")
file(WRITE "${distinfo}/METADATA"
     "Metadata-Version: 2.1\nName: ckptfs\nVersion: ${CKPTFS_VERSION}\n"
     "Summary: Python side of ckptfs (lazy loads, snapshots, resharding)\n"
     "Requires-Python: >=3.9\nRequires-Dist: numpy\n")
# "debian": Debian's pip leaves the package to dpkg instead of uninstalling it.
file(WRITE "${distinfo}/INSTALLER" "debian\n")
file(WRITE "${distinfo}/top_level.txt" "ckptfs\n")
file(INSTALL "${distinfo}" DESTINATION "${pydir}")

# The mount(8) helper and the systemd unit template, naming the installed binary.
foreach(helper mount.fuse.ckptfs)
  file(READ "${CKPTFS_SOURCE_DIR}/packaging/${helper}" text)
  string(REPLACE "@CKPTFS_BINARY@" "${bin}" text "${text}")
  file(WRITE "${stage}/${helper}" "${text}")
  file(INSTALL "${stage}/${helper}" DESTINATION "${CKPTFS_MOUNT_HELPER_DIR}"
       FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE
                        WORLD_READ WORLD_EXECUTE)
endforeach()
if(IS_ABSOLUTE "${CKPTFS_SYSTEMD_UNIT_DIR}")
  set(unitdir "${CKPTFS_SYSTEMD_UNIT_DIR}")
else()
  set(unitdir "${prefix}/${CKPTFS_SYSTEMD_UNIT_DIR}")
endif()
file(READ "${CKPTFS_SOURCE_DIR}/packaging/systemd/ckptfs@.service" text)
string(REPLACE "@CKPTFS_BINARY@" "${bin}" text "${text}")
file(WRITE "${stage}/ckptfs@.service" "${text}")
file(INSTALL "${stage}/ckptfs@.service" DESTINATION "${unitdir}")
